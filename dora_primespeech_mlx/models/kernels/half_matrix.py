"""A float16 weight matrix multiplied with float32 accumulation: :class:`HalfMatrix`.

``W @ x`` (a vector: the kernels' gemv) and ``act(x @ W.T + b)`` (rows: :meth:`HalfMatrix.matmul_t`) on two
paths: ``float16``, the kernels' small-M GEMM reading the float16 weight; ``float32``, the weight upcast into a
reused scratch buffer and multiplied by BLAS ``sgemm`` (the float32 model's product, for CPUs where the float16
GEMM is the slower one; ``models/kernels/cpu_paths.py`` chooses per stage). Both accumulate in float32; the weight is
stored once, in float16.
"""

from __future__ import annotations

import threading

import numpy as np

_SCRATCH = threading.local()  # per thread: the float32 upcast buffer of the float32 path


def _scratch(size: int) -> np.ndarray:
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.size < size:
        buf = _SCRATCH.buf = np.empty(size, dtype=np.float32)
    return buf[:size]


def release_scratch() -> None:
    """Drop this thread's upcast buffer (it is rebuilt on the next float32-path product)."""
    _SCRATCH.buf = None


class HalfMatrix:
    """A float16 (n, k) weight used as ``W @ x`` (vector: the gemv kernel, float32 accumulation) and
    ``x @ W.T`` (matrix: :meth:`matmul_t`). ``fn``: the kernels (``half_gemv.library()``)."""

    __slots__ = ("w", "fn")

    def __init__(self, w: np.ndarray, fn):
        if w.dtype != np.float16 or w.ndim != 2:
            raise ValueError(f"HalfMatrix needs a 2-D float16 array, not {w.dtype} {w.shape}")
        self.w = np.ascontiguousarray(w)
        self.fn = fn

    @property
    def shape(self) -> tuple[int, int]:
        return self.w.shape

    def float32(self, out: np.ndarray | None = None) -> np.ndarray:
        """The weight upcast to float32 (into ``out`` when given, else a new array), with the kernel's vectorised
        conversion (exact: every float16 value is a float32 value)."""
        if out is None:
            out = np.empty(self.w.shape, dtype=np.float32)
        elif out.shape != self.w.shape or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise ValueError(f"float32: out must be a contiguous float32 array of shape {self.w.shape}")
        self.fn.upcast(self.w.ctypes.data, out.ctypes.data, self.w.size)
        return out

    @property
    def T(self) -> np.ndarray:  # noqa: N802  (numpy's name)
        return self.float32().T

    def matvec(self, x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        n, k = self.w.shape
        if x.shape != (k,):
            raise ValueError(f"matvec: x has shape {x.shape}, expected ({k},)")
        y = np.empty(n, dtype=np.float32)
        b = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)  # alive during the call
        self.fn(self.w.ctypes.data, x.ctypes.data, None if b is None else b.ctypes.data, y.ctypes.data, n, k)
        return y

    def matmul_t(self, x: np.ndarray, bias: np.ndarray | None = None, act: str | None = None,
                 path: str = "float16") -> np.ndarray:
        """``act(x @ W.T + bias)`` for x (..., k) float32, accumulated in float32; ``act``: None, ``"relu"`` or
        ``"gelu"`` (exact, erf). ``path``: ``"float16"`` (the kernels' GEMM on the float16 weight, no float32 copy)
        or ``"float32"`` (the weight upcast into this thread's scratch buffer, then BLAS)."""
        n, k = self.w.shape
        if x.shape[-1] != k:
            raise ValueError(f"matmul_t: x has shape {x.shape}, expected (..., {k})")
        if act not in self.fn.ACT:
            raise ValueError(f"matmul_t: act {act!r}: expected None, 'relu' or 'gelu'")
        lead = x.shape[:-1]
        x2 = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, k)
        m = x2.shape[0]
        b = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
        if b is not None and b.shape != (n,):
            raise ValueError(f"matmul_t: bias has shape {b.shape}, expected ({n},)")
        if path == "float32":
            w32 = self.float32(_scratch(n * k).reshape(n, k))
            y = np.ascontiguousarray(x2 @ w32.T)
            self.fn.bias_act(y.ctypes.data, None if b is None else b.ctypes.data, m, n, self.fn.ACT[act])
            return y.reshape(*lead, n)
        if path != "float16":
            raise ValueError(f"matmul_t: path {path!r}: expected 'float16' or 'float32'")
        y = np.empty((m, n), dtype=np.float32)
        self.fn.gemm(self.w.ctypes.data, x2.ctypes.data, None if b is None else b.ctypes.data, y.ctypes.data, m, n, k,
                     act)
        return y.reshape(*lead, n)

    def __matmul__(self, x: np.ndarray) -> np.ndarray:
        if np.ndim(x) == 1:
            return self.matvec(x)
        return self.float32() @ x
