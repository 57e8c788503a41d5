"""What runs where, for ``stats()``: the MLX device, the encoder backends (CoreML or MLX, with fallback
reasons), the GPT decode implementation and its weights' precision, the SoVITS backend, the CPU BLAS with its thread
settings and the engine's runtime (every choice it was built with)."""

from __future__ import annotations

from .. import _blas
from ..models.sovits import vocoder
from .cache import encoders_key, file_identity


def backends(engine) -> dict:
    """Read from what the current voice has loaded (nothing is loaded, and the cache order is not touched)."""
    voice = engine.voice
    encoders, gpt, sovits = {"mode": engine.encoders}, "not loaded", {"backend": "not loaded"}
    gpt_precision = "not loaded"
    if voice is not None:
        enc = engine.cache.peek(encoders_key(voice.hubert, voice.bert))
        model = engine.cache.peek(engine.store.key("gpt", file_identity(voice.gpt)))
        encoders = enc.status() if enc is not None else encoders
        gpt = model.decoder.backend if model is not None else gpt
        if model is not None:  # the decode step's weights (PRIMESPEECH_PRECISION int8), once its views are built
            views = getattr(model.decoder, "_weights", None)
            gpt_precision = views.precision if views is not None else "exact"
        voc = engine.cache.peek(engine.store.key("sovits", file_identity(voice.sovits)))
        if voc is not None:  # which backend runs the SoVITS generator (models/sovits/vocoder.py)
            sovits = vocoder.status(voc)
    return {
        "device": engine.device_name,
        "encoders": encoders,
        "gpt": gpt,
        "gpt_precision": gpt_precision,
        "sovits": sovits,
        "blas": {**_blas.info(), "threads": _blas.thread_settings()},
        "runtime": engine.runtime.describe(),
    }

