"""float16-weight matrix-vector products with float32 accumulation, for the GPT decode step on the CPU.

A decode step reads every block weight once per token (~300 MB in float32 for v2): it is bound by memory
bandwidth. The released GPT checkpoints store their weights as float16, so keeping them in float16 loses
nothing — but numpy and BLAS have no float16 x float32 product, and upcasting the matrix per call costs
more than it saves (``models/storage.py``). This module's kernel reads the float16 row, converts it in
registers (F16C) and accumulates in float32 with FMA: half the bytes per token, the same weights. Measured
on the real-size v2 GPT (one run, 1 thread): 11.6 ms per decode step against 27.6 ms for numpy float32.

The kernel is ~25 lines of C compiled once with the system C compiler (the one ``mx.compile`` and the BLAS
shim use) into the package's cache directory. :func:`kernel` returns None where it cannot be had (not
x86-64 with AVX2/FMA/F16C, no compiler, ``PRIMESPEECH_GPT_HALF=0``); callers then keep float32.
"""

from __future__ import annotations

import ctypes
import logging
import platform
import subprocess

import numpy as np

log = logging.getLogger(__name__)

ENV = "PRIMESPEECH_GPT_HALF"

_SOURCE = r"""
#include <stdint.h>
#include <immintrin.h>
/* y[i] = sum_j W[i, j] x[j] (+ b[i]); W float16 row-major (n x k), x, b, y float32. */
void gemv_f16(const uint16_t *W, const float *x, const float *b, float *y, int64_t n, int64_t k) {
  const int64_t k16 = k & ~(int64_t)15;
  for (int64_t i = 0; i < n; i++) {
    const uint16_t *w = W + i * k;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (int64_t j = 0; j < k16; j += 16) {
      a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + j))), _mm256_loadu_ps(x + j), a0);
      a1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + j + 8))),
                           _mm256_loadu_ps(x + j + 8), a1);
    }
    __m256 s = _mm256_add_ps(a0, a1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_hadd_ps(h, h);
    h = _mm_hadd_ps(h, h);
    float acc = _mm_cvtss_f32(h);
    for (int64_t j = k16; j < k; j++) acc += _cvtsh_ss(w[j]) * x[j];
    y[i] = b ? acc + b[i] : acc;
  }
}
/* dst[i] = (float)src[i]: the prefill's upcast of one weight (numpy's float16 astype is ~10x slower). */
void f16_to_f32(const uint16_t *src, float *dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
  for (; i < n; i++) dst[i] = _cvtsh_ss(src[i]);
}
"""
_FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c"]
_STATE: dict[str, object] = {}  # the built kernel ("fn") and why not ("why"), once per process and mode


_CONFIGURED: dict[str, str] = {}


def configure(value: str) -> None:
    """Set the process-wide choice (the engine passes its ``Settings.gpt_half``): ``auto``, ``1`` or ``0``."""
    value = {"1": "on", "0": "off"}.get(str(value), str(value))
    if value not in ("auto", "on", "off"):
        raise ValueError(f"gpt_half {value!r}: expected auto, 1 or 0")
    if _CONFIGURED.get("mode") != value:
        _CONFIGURED["mode"] = value
        _STATE.clear()


def mode() -> str:
    """``PRIMESPEECH_GPT_HALF`` (or :func:`configure`): ``auto`` (default: on where the kernel builds and the
    weights are exactly float16), ``on`` (``1``: also rounds other weights; a warning when the kernel cannot
    be had), ``off`` (``0``: never)."""
    return _CONFIGURED.get("mode", "auto")


def _cpu_ok() -> str | None:
    """None when this CPU runs the kernel, else why not."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"{platform.machine()} is not x86-64"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return "cannot read /proc/cpuinfo"
    missing = [x for x in ("avx2", "fma", "f16c") if x not in flags]
    return f"CPU lacks {', '.join(missing)}" if missing else None


def _build() -> str:
    from .._blas import compile_shared

    return compile_shared("gemv-f16", _SOURCE, _FLAGS)


def kernel():
    """The ctypes ``gemv_f16`` function, or None (see :func:`status` for why). Built once per process."""
    if "fn" in _STATE:
        return _STATE["fn"]
    fn, why = None, None
    m = mode()
    if m == "off":
        why = f"{ENV}=0 (off)"
    else:
        why = _cpu_ok()
        if why is None:
            try:
                fn = _Kernel(ctypes.CDLL(_build()))
                if not _self_check(fn):
                    fn, why = None, "self-check failed"
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                why = f"cannot build the kernel: {exc}"
        if why and m == "on":  # asked for explicitly
            log.warning("%s=1 but float16 GPT decode weights are unavailable: %s", ENV, why)
    _STATE.update(fn=fn, why=why)
    return fn


class _Kernel:
    """The compiled library: ``kernel(W, x, b, y, n, k)`` is ``gemv_f16``; ``upcast(src, dst, n)``."""

    def __init__(self, lib):
        self.gemv = lib.gemv_f16
        self.gemv.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 2
        self.gemv.restype = None
        self.upcast = lib.f16_to_f32
        self.upcast.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        self.upcast.restype = None

    def __call__(self, *args) -> None:
        self.gemv(*args)


def _self_check(fn) -> bool:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((7, 37)).astype(np.float16)
    x = rng.standard_normal(37).astype(np.float32)
    b = rng.standard_normal(7).astype(np.float32)
    y = np.empty(7, np.float32)
    fn(w.ctypes.data, x.ctypes.data, b.ctypes.data, y.ctypes.data, 7, 37)
    up = np.empty(w.shape, np.float32)
    fn.upcast(w.ctypes.data, up.ctypes.data, w.size)
    exact = bool(np.array_equal(up, w.astype(np.float32)))
    return exact and bool(np.allclose(y, w.astype(np.float32) @ x + b, atol=1e-4))


def status() -> dict[str, object]:
    kernel()
    return {"mode": mode(), "kernel": _STATE.get("fn") is not None, "why_not": _STATE.get("why")}


class HalfMatrix:
    """A float16 (n, k) weight used as ``W @ x`` (vector: the kernel, float32 accumulation) and
    ``x @ W.T`` (matrix: upcast once for the product, as a prefill does)."""

    __slots__ = ("w", "fn")

    def __init__(self, w: np.ndarray, fn):
        if w.dtype != np.float16 or w.ndim != 2:
            raise ValueError(f"HalfMatrix needs a 2-D float16 array, not {w.dtype} {w.shape}")
        self.w = np.ascontiguousarray(w)
        self.fn = fn

    @property
    def shape(self) -> tuple[int, int]:
        return self.w.shape

    def float32(self) -> np.ndarray:
        """The weight upcast to float32 (a new array), with the kernel's vectorised conversion."""
        out = np.empty(self.w.shape, dtype=np.float32)
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

    def __matmul__(self, x: np.ndarray) -> np.ndarray:
        if np.ndim(x) == 1:
            return self.matvec(x)
        return self.float32() @ x
