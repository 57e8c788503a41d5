"""The opt-in reduced-precision GPT decode step: int8 weights with one float32 scale per row (:class:`Q8Matrix`).

The decode step is bound by reading its weights (178 MB per token in float16, docs/performance.md). With the runtime's
``precision`` ``int8`` (``PRIMESPEECH_PRECISION``) the four products of every block read int8 weights instead,
each row rounded to ``S = max|row| / 127`` steps (``quantize_rows_q8`` in ``csrc/half_gemv.c``): half the bytes per
token. The step vector, the sums, attention, the norms and the head stay float32, and so do the prefill and every
other model: only the decode products' weights change, by at most half a step each. That changes the logits, so
it is never the default; its fidelity against the exact path (token agreement, mel distance on the fixtures) is
``tests/tools/precision_fidelity.py``. The int8 weights are a second copy beside the model's own (the prefill keeps
using those): +1 byte per block weight (~75 MB for the v2 GPT).

Where it runs: the AVX-512 build of the kernels (the CPU's flags, read at run time by ``half_gemv.choose_isa``).
Elsewhere (the AVX2 and portable builds, no kernels) the step stays exact and one INFO line says why.
"""

from __future__ import annotations

import logging

import mlx.core as mx
import numpy as np

from . import half_gemv

log = logging.getLogger(__name__)

ENV = "PRIMESPEECH_PRECISION"
NEEDS_ISA = ("avx512",)  # the builds the int8 step is offered on
_SAID: set[str] = set()


def kernel(runtime):
    """The kernels to run the int8 step with (on the runtime's thread plan), or None: ``precision`` is ``exact``,
    or the build in use is not one of :data:`NEEDS_ISA` (then one INFO line per reason and process)."""
    fn, why = status(runtime)
    if why and runtime.reduced("int8") and why not in _SAID:
        _SAID.add(why)
        log.info("%s=%s: int8 unavailable, the GPT decode step stays exact: %s", ENV, runtime.precision, why)
    return fn


def status(runtime) -> tuple[object | None, str | None]:
    """(the kernels for the int8 step or None, why not or None)."""
    if not runtime.reduced("int8"):
        return None, f"{ENV}={runtime.precision}"
    lib = half_gemv.library(runtime.isa, runtime.threads)
    isa = half_gemv.isa(runtime.isa)
    if lib is None or isa not in NEEDS_ISA:
        return None, f"needs the {'/'.join(NEEDS_ISA)} kernels, this process runs {isa}"
    return lib, None


class Q8Matrix:
    """An (n, k) weight as int8 rows ``q`` and their float32 scales ``s``: ``W ~= s[:, None] * q``."""

    __slots__ = ("q", "s", "fn")

    def __init__(self, q: np.ndarray, s: np.ndarray, fn):
        self.q, self.s, self.fn = q, s, fn

    @classmethod
    def from_weight(cls, w, fn) -> Q8Matrix:
        """Quantize ``w`` (an MLX or numpy (n, k) array of any float type) row by row."""
        if isinstance(w, mx.array):
            mx.eval(w)
            w = np.array(w.astype(mx.float32) if w.dtype != mx.float32 else w, copy=False)
        w = np.ascontiguousarray(w, dtype=np.float32)
        n, k = w.shape
        q, s = np.empty((n, k), dtype=np.int8), np.empty(n, dtype=np.float32)
        fn.quantize_rows_q8(w.ctypes.data, q.ctypes.data, s.ctypes.data, n, k)
        return cls(q, s, fn)

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape

    def dequantized(self) -> np.ndarray:
        """``s[:, None] * q`` as float32: the weight the int8 products compute with."""
        return self.s[:, None] * self.q.astype(np.float32)

    def __matmul__(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        y = np.empty(self.q.shape[0], dtype=np.float32)
        self.fn.gemv_q8_mt(self.q.ctypes.data, self.s.ctypes.data, x.ctypes.data, None, y.ctypes.data,
                           self.q.shape[0], self.q.shape[1], self.fn.nthreads())
        return y


def block_weights(block, fn) -> tuple[Q8Matrix, Q8Matrix, Q8Matrix, Q8Matrix]:
    """One GPT block's four products (qkv, out, fc1, fc2) as int8 rows."""
    return tuple(Q8Matrix.from_weight(m.weight, fn)
                 for m in (block.attn.qkv, block.attn.out, block.mlp.fc1, block.mlp.fc2))
