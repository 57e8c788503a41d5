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
        gpt = str(getattr(models.gpt, "decoder_name", None) or _default_decoder())
    return {
        "device": str(engine.device if engine.device is not None else mx.default_device()),
        "encoders": encoders,
        "gpt": gpt,
        "sovits": "mlx",
        "blas": {**_blas.info(), "threads": _blas.thread_settings()},
    }


def _default_decoder() -> str:
    from ..models import t2s_generate

    try:
        return str(t2s_generate.decode_backend())
    except Exception:  # a bad override is reported by the GPT stage itself
        return "unknown"
