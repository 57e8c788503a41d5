"""Which backend runs the SoVITS generator (the vocoder): ONNX Runtime on CPU-only machines, MLX elsewhere.

``PRIMESPEECH_VOCODER`` (declared in settings.py):

- ``auto`` (default): ONNX Runtime (:mod:`.vocoder_onnx`) when MLX's default device is the CPU, MLX on a GPU;
- ``onnx``: ONNX Runtime on any device;
- ``mlx``: always MLX.

:func:`attach` gives a loaded :class:`~.sovits.SoVITSModel` its backend; ``SoVITSModel.vocode`` (hence
``decode`` and everything the engine calls) then runs the generator there. Any failure — ``onnxruntime``
or ``onnx`` missing, a graph that does not build or load, an error while running — logs **one** warning
and falls back to MLX for good; :func:`status` (the engine's ``stats()["backends"]["sovits"]``) says
which backend runs and why.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

ENV = "PRIMESPEECH_VOCODER"
MODES = ("auto", "onnx", "mlx")


def _on_cpu() -> bool:
    import mlx.core as mx

    return mx.default_device().type == mx.cpu


class VocoderBackend:
    """The generator backend attached to one SoVITS model (see the module docstring)."""

    def __init__(self, mode: str, generator=None, reason: str = "", error: str | None = None, split=None):
        self.mode = mode
        self.generator = generator
        self.reason = reason
        self.error = error
        self.split = split  # a vocoder_split.SplitRunner over the generator (several cores), or None
        self.calls = {"onnx": 0, "mlx": 0}

    def wants_onnx(self) -> bool:
        if self.generator is None:
            return False
        return self.mode == "onnx" or _on_cpu()

    def run(self, z, ge) -> np.ndarray | None:
        """The generator on ONNX Runtime (numpy in, numpy out), or None when MLX must run it (not chosen
        on this device, or failed: then disabled for good after one warning)."""
        if not self.wants_onnx():
            self.calls["mlx"] += 1
            return None
        try:
            run = self.split if self.split is not None else self.generator
            audio = run(np.asarray(z, dtype=np.float32), np.asarray(ge, dtype=np.float32))
        except Exception as exc:
            self.fail(f"onnxruntime run failed: {type(exc).__name__}: {exc}")
            self.calls["mlx"] += 1
            return None
        self.calls["onnx"] += 1
        return audio

    def fail(self, error: str) -> None:
        log.warning("SoVITS vocoder: %s; using MLX from now on", error)
        self.generator = self.split = None
        self.error = error

    @property
    def active(self) -> str:
        return "onnxruntime" if self.wants_onnx() else "mlx"

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"backend": self.active, "mode": self.mode, "calls": dict(self.calls)}
        if self.reason:
            out["reason"] = self.reason
        if self.error:
            out["error"] = self.error
        if self.generator is not None:
            out.update(self.generator.describe())
        if self.split is not None:
            out["split"] = self.split.describe()
        return out


def attach(sovits, cache_dir: str | os.PathLike | None = None, mode: str = "auto", threads: int | None = None,
           parts: str | int = "1"):
    """Give ``sovits`` its generator backend (see the module docstring); returns ``sovits``.
    ``cache_dir``: where the ONNX graph is cached (None: built in memory). ``parts``: ONNX Runtime runs the
    generator over this many time stretches at once, one single-threaded run per core (``models/vocoder_split``;
    ``auto``: the thread count; ``1``: whole, with ``threads`` intra-op threads)."""
    if mode not in MODES:
        raise ValueError(f"vocoder mode {mode!r}: expected one of {', '.join(MODES)}")
    if mode == "mlx":
        backend = VocoderBackend(mode, reason=f"{ENV}=mlx")
    elif mode == "auto" and not _on_cpu():
        backend = VocoderBackend(mode, reason="MLX default device is a GPU")
    else:
        try:
            from . import vocoder_onnx

            n = vocoder_onnx.resolve_threads(threads) if str(parts) == "auto" else int(parts)
            generator = vocoder_onnx.load_or_build(sovits.dec, cache_dir, 1 if n > 1 else threads)
            backend = VocoderBackend(mode, generator, reason="CPU" if mode == "auto" else f"{ENV}=onnx")
            if n > 1:
                from .vocoder_split import SplitRunner

                backend.split = SplitRunner(generator, n, sovits.dec.receptive_frames, sovits.samples_per_frame)
        except Exception as exc:  # ImportError, a build or load error: MLX it is
            backend = VocoderBackend(mode, reason="fallback")
            backend.fail(f"ONNX Runtime backend unavailable: {type(exc).__name__}: {exc}")
    sovits.vocoder_backend = backend
    return sovits


def status(sovits) -> dict[str, Any]:
    """What runs the generator of ``sovits`` (``{"backend": "mlx"}`` when none was attached)."""
    backend = getattr(sovits, "vocoder_backend", None)
    return backend.status() if backend is not None else {"backend": "mlx", "mode": "not attached"}
