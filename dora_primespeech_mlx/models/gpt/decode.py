"""The three :class:`~.t2s.Decoder` implementations of the GPT's prefix and one-token steps, and the one
place that picks among them (:func:`make_decoder`, called once when the model is loaded).

- ``"mlx"``: :meth:`T2SModel.prefill` and :meth:`T2SModel.step` as they are (eager MLX);
- ``"compile"``: the same, with the step under ``mx.compile`` (one trace per KV bucket; the weights
  are passed as state, so new weights need no re-trace). For GPUs, where launching the ~300 small
  kernels of an eager step costs more than the math;
- ``"numpy"``: :class:`.numpy_decoder.NumpyDecoder`, gemv instead of MLX's M=1 sgemm: about twice as fast
  on the CPU (docs/performance.md, "The GPT step in numpy").

``"auto"`` is numpy when MLX computes on the CPU, compiled MLX otherwise (Metal/CUDA).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ...runtime import DEFAULT, Runtime
from .kv_cache import CACHE_STEP, KVCache
from .model import DecodeFn, Decoder, T2SModel
from .numpy_decoder import NumpyDecoder

DECODERS = ("auto", "mlx", "compile", "numpy")


def decoder_kind(decode: str = "auto", compile_step: bool | None = None) -> str:
    """The concrete decoder (``"mlx"``, ``"compile"`` or ``"numpy"``) for the ``decode`` choice on the
    current default device. ``compile_step`` (None = on off the CPU) says whether an MLX step is
    compiled when ``decode`` is ``"auto"`` on a GPU or ``"mlx"``; ``"compile"`` always compiles."""
    choice = (decode or "auto").strip().lower()
    if choice not in DECODERS:
        raise ValueError(f"GPT decode backend {decode!r}: expected one of {', '.join(DECODERS)}")
    on_cpu = mx.default_device().type == mx.cpu
    if choice == "auto":
        choice = "numpy" if on_cpu else "mlx"
    if choice == "mlx" and (compile_step if compile_step is not None else not on_cpu):
        choice = "compile"
    return choice


def make_decoder(model: T2SModel, runtime: Runtime = DEFAULT, cache_step: int = CACHE_STEP) -> Decoder:
    """The decoder of ``model`` for the runtime's ``t2s_decode`` / ``t2s_compile`` (see :func:`decoder_kind`; the
    numpy one with the runtime's kernel choices); MLX decoders grow their KV cache ``cache_step`` rows at a
    time."""
    kind = decoder_kind(runtime.t2s_decode, runtime.t2s_compile)
    if kind == "numpy":
        return NumpyDecoder(model, runtime=runtime)
    if kind == "compile":
        return CompiledDecoder(model, cache_step)
    return MLXDecoder(model, cache_step)


class MLXSession:
    """One generation on an MLX decoder: its KV cache and the step function."""

    def __init__(self, model: T2SModel, cache: KVCache, decode: DecodeFn | None):
        self.model, self.cache, self.decode = model, cache, decode

    def step(self, token: int, position: int) -> np.ndarray:
        return np.array(self.model.step(token, position, self.cache, self.decode)[0], dtype=np.float32)


class MLXDecoder:
    """Eager MLX: the model's own :meth:`~T2SModel.prefill` and :meth:`~T2SModel.step`."""

    kind = "mlx"
    backend = "mlx"

    def __init__(self, model: T2SModel, cache_step: int = CACHE_STEP):
        self.model, self.cache_step = model, cache_step

    def step_fn(self) -> DecodeFn | None:
        """What replaces :meth:`T2SModel.decode` in a step (None: the eager method)."""
        return None

    def prefill(
        self, phones: np.ndarray, bert: np.ndarray, prompt: np.ndarray, max_new: int
    ) -> tuple[MLXSession, np.ndarray]:
        cache = self.model.make_cache(self.cache_step)  # grows by buckets: max_new is not needed
        logits = self.model.prefill(mx.array(phones), mx.array(bert), mx.array(prompt), cache)
        return MLXSession(self.model, cache, self.step_fn()), np.array(logits[0], dtype=np.float32)

    def warmup(self, prefix_rows: int = 256) -> None:
        """Nothing to build for the eager step."""


class CompiledDecoder(MLXDecoder):
    """MLX with the one-token step under ``mx.compile`` (traced once per KV-cache capacity)."""

    kind = "compile"

    def __init__(self, model: T2SModel, cache_step: int = CACHE_STEP):
        super().__init__(model, cache_step)
        self._compiled: DecodeFn | None = None

    def step_fn(self) -> DecodeFn:
        if self._compiled is None:
            self._compiled = mx.compile(self.model.decode, inputs=self.model.state)
        return self._compiled

    def warmup(self, prefix_rows: int = 256) -> None:
        """Trace the step for the buckets a prefix of up to ``prefix_rows`` rows (and its first
        ``cache_step`` tokens) uses."""
        step = self.cache_step
        for rows in range(step, prefix_rows + 2 * step, step):
            cache = self.model.make_cache(step)
            cache.reserve(rows)
            cache.offset = rows - 1
            mx.eval(self.model.step(0, 0, cache, self.step_fn()))
