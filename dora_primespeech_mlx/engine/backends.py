"""What runs where, for ``stats()``: the MLX device, the encoder backends (CoreML or MLX, with fallback
reasons), the GPT decode implementation, the SoVITS backend and the CPU BLAS with its thread settings."""

from __future__ import annotations

import mlx.core as mx

from .. import _blas


def backends(engine) -> dict:
    voice = engine.voice
    encoders = {"mode": engine.encoders}
    gpt = "not loaded"
    if voice is not None:
        models = engine._models(voice)
        encoders = models.encoders.status()
        gpt = models.gpt.decoder.backend  # models-arch
    return {
        "device": str(engine.device if engine.device is not None else mx.default_device()),
        "encoders": encoders,
        "gpt": gpt,
        "sovits": "mlx",
        "blas": {**_blas.info(), "threads": _blas.thread_settings()},
    }

