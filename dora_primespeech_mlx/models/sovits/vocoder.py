"""Which backend runs the SoVITS generator (the vocoder): ONNX Runtime on CPU-only machines, MLX elsewhere.

``PRIMESPEECH_VOCODER`` (declared in settings.py):

- ``auto`` (default): ONNX Runtime (:mod:`.vocoder_onnx`) when MLX's default device is the CPU, MLX on a GPU;
- ``onnx``: ONNX Runtime on any device;
- ``openvino``: OpenVINO's CPU plugin (:mod:`.vocoder_openvino`; the optional extra ``openvino``) on the same graph,
  run whole with ``threads`` threads (``PRIMESPEECH_VOCODER_PARTS`` and ``_SPIN`` are ONNX Runtime's); where it is
  not installed or fails to load, ONNX Runtime;
- ``mlx``: always MLX.

:func:`build` makes the backend, which its owner hands to the model (``SoVITSModel.use_vocoder``). Any failure
logs **one** warning and falls back to MLX for good; :func:`status` says which backend runs and why. While ONNX
Runtime serves the generator the MLX copy of its weights is not kept resident (:class:`MLXWeights`)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from ..kernels import half_gemv
from ..shared.storage import trim_heap
from . import vocoder_onnx
from .conv import _WeightCache
from .vocoder_split import SplitRunner

log = logging.getLogger(__name__)

ENV = "PRIMESPEECH_VOCODER"
MODES = ("auto", "onnx", "openvino", "mlx")


def _on_cpu() -> bool:
    return mx.default_device().type == mx.cpu


class VocoderBackend:
    """The generator backend of one SoVITS model (see the module docstring)."""

    def __init__(self, mode: str, generator=None, reason: str = "", error: str | None = None, split=None):
        self.mode = mode
        self.generator = generator
        self.reason = reason
        self.error = error
        self.split = split  # a vocoder_split.SplitRunner over the generator (several cores), or None
        describe = getattr(generator, "describe", None)  # the runtime outside MLX: onnxruntime or openvino
        self.runtime = (describe() if describe is not None else {}).get("runtime", "onnxruntime")
        self.calls = {"onnx": 0, "mlx": 0}
        self.mlx_weights: MLXWeights | None = None  # set when the MLX generator's weights were dropped

    def wants_onnx(self) -> bool:
        """Whether the generator runs outside MLX (ONNX Runtime or OpenVINO) on this call."""
        if self.generator is None:
            return False
        return self.mode in ("onnx", "openvino") or _on_cpu()

    def run(self, z, ge) -> np.ndarray | None:
        """The generator on ONNX Runtime (numpy in, numpy out), or None when MLX must run it (not chosen
        on this device, or failed: then disabled for good after one warning)."""
        audio = self.run_onnx(z, ge) if self.wants_onnx() else None
        if audio is None:
            self._to_mlx()
        return audio

    def run_onnx(self, z, ge) -> np.ndarray | None:
        """ONNX Runtime only, touching no MLX state (for a worker thread): the audio, or None when MLX must run
        it (no generator, or this run failed: then disabled for good after one warning). The caller runs MLX
        on its own thread (``SoVITSModel.vocode``), which reads dropped weights back first."""
        if self.generator is None:
            return None
        try:
            run = self.split if self.split is not None else self.generator
            audio = run(np.asarray(z, dtype=np.float32), np.asarray(ge, dtype=np.float32))
        except Exception as exc:
            self.fail(f"{self.runtime} run failed: {type(exc).__name__}: {exc}")
            return None
        self.calls["onnx"] += 1
        return audio

    def _to_mlx(self) -> None:
        """MLX runs this call (``run`` returns None): its generator weights are read back first if dropped."""
        if self.mlx_weights is not None and self.mlx_weights.dropped:
            self.mlx_weights.restore()
        self.calls["mlx"] += 1

    def fail(self, error: str) -> None:
        log.warning("SoVITS vocoder: %s; using MLX from now on", error)
        self.generator = self.split = None
        self.error = error

    @property
    def active(self) -> str:
        return self.runtime if self.wants_onnx() else "mlx"

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
        if self.mlx_weights is not None:
            out["mlx_weights"] = self.mlx_weights.state()
        return out


class MLXWeights:
    """The MLX generator's weights of one SoVITS model, dropped while ONNX Runtime serves the generator and
    read back from the model's converted ``weights_file`` when MLX must run it.

    While ONNX Runtime serves the generator, the MLX generator's weights (a second copy of them, plus the GEMM layout
    of its transposed convolutions) are not kept resident when the model came from a converted file
    (``weights_file``, set by ``convert.load``): they are dropped after the session is built and read back from that
    file the first time MLX must run the generator (a failure, or MLX chosen later), checking that they are the
    weights the ONNX graph was built from. A model built in memory keeps them."""

    PREFIX = "dec."

    def __init__(self, sovits, weights_file: str | os.PathLike, digest: str, layout: str):
        self.sovits, self.weights_file, self.digest, self.layout = sovits, Path(weights_file), digest, layout
        self.shapes: dict[str, tuple] = {}
        self.dropped = False
        self.nbytes = 0
        self.restores = 0

    def drop(self) -> int:
        """Replace every generator weight by an empty array and forget the derived GEMM weights; returns the
        bytes released (handed back to the OS by the caller's ``trim_heap``)."""
        dec = self.sovits.dec
        params = tree_flatten(dec.parameters())
        self.shapes = {k: (tuple(v.shape), v.dtype) for k, v in params}
        self.nbytes = sum(v.nbytes for _, v in params)
        for module in dec.modules():
            cache = getattr(module, "_cache", None)
            if isinstance(cache, _WeightCache):
                if cache.value is not None:
                    self.nbytes += cache.value.nbytes
                module._cache = _WeightCache()
        empty = mx.zeros((0,), dtype=mx.float32)
        del params
        dec.update(tree_unflatten([(k, empty) for k in self.shapes]))
        self.dropped = True
        return self.nbytes

    def restore(self) -> None:
        """Read the generator weights back from ``weights_file``; raises RuntimeError when the file is gone or
        no longer holds the weights the ONNX graph was built from."""
        try:
            stored = mx.load(str(self.weights_file), format="safetensors")
        except (OSError, ValueError, RuntimeError) as exc:
            raise RuntimeError(f"cannot read the generator weights back from {self.weights_file}: {exc}") from exc
        items = [(k[len(self.PREFIX):], v) for k, v in stored.items() if k.startswith(self.PREFIX)]
        del stored
        found = {k: (tuple(v.shape), v.dtype) for k, v in items}
        if found != self.shapes:
            raise RuntimeError(f"{self.weights_file} no longer holds this model's generator weights")
        dec = self.sovits.dec
        dec.update(tree_unflatten(items))
        mx.eval(dec.parameters())
        del items
        digest = vocoder_onnx.weights_digest(vocoder_onnx.generator_weights(dec), self.layout)
        if digest != self.digest:
            raise RuntimeError(f"{self.weights_file} changed since the model was loaded (generator weights differ)")
        dec.prepare()
        self.dropped = False
        self.restores += 1
        log.info("SoVITS vocoder: MLX generator weights read back from %s", self.weights_file)

    def state(self) -> dict[str, Any]:
        return {"dropped": self.dropped, "bytes": self.nbytes, "restores": self.restores,
                "file": str(self.weights_file)}


def build(sovits, cache_dir: str | os.PathLike | None = None, mode: str = "auto", threads: int | None = None,
          release_mlx: bool = True, parts: str | int = "1", spin: bool | None = None,
          arena: bool = False, cores=None, precision: str = "f32") -> VocoderBackend:
    """The generator backend for ``sovits`` (see the module docstring), for ``sovits.use_vocoder``.
    ``cache_dir``: where the ONNX graph is cached (None: built in memory). ``release_mlx``: drop the MLX
    generator's weights while ONNX Runtime serves it, where they can be read back (``sovits.weights_file``).
    ``parts``: ONNX Runtime runs the generator over this many time stretches at once, one
    single-threaded run per core (``models/vocoder_split``; latents too short for that run whole with ``threads``
    intra-op threads; ``auto``: :func:`auto_parts`; ``1``: always whole). ``spin``: the intra-op threads spin
    between convolutions (None: off); ``arena``: ONNX Runtime's CPU memory arena (off: buffers go back to the heap).
    ``cores``: () -> the cores free now; a cut vocoder runs whole on one thread while they are fewer than its parts.
    ``precision``: ``f32``, or ``bf16`` (the opt-in ``PRIMESPEECH_PRECISION=bf16``: on the CPU the generator runs
    whole on OpenVINO in bfloat16 where the CPU has native bfloat16 products and the extra is installed; elsewhere
    the float32 choice, one INFO line). :func:`from_runtime` passes an engine runtime's choices."""
    if mode not in MODES:
        raise ValueError(f"vocoder mode {mode!r}: expected one of {', '.join(MODES)}")
    previous = getattr(sovits, "vocoder_backend", None)
    if previous is not None and previous.mlx_weights is not None and previous.mlx_weights.dropped:
        previous.mlx_weights.restore()  # built again: the graph is built from the MLX weights
    if mode == "mlx":
        backend = VocoderBackend(mode, reason=f"{ENV}=mlx")
    elif mode == "auto" and not _on_cpu():
        backend = VocoderBackend(mode, reason="MLX default device is a GPU")
    elif precision == "bf16" and (backend := _bf16(sovits, cache_dir, threads)) is not None:
        pass
    elif mode == "openvino" and (backend := _openvino(sovits, cache_dir, threads)) is not None:
        pass
    else:
        try:
            n = auto_parts(vocoder_onnx.resolve_threads(threads)) if str(parts) == "auto" else int(parts)
            generator = vocoder_onnx.load_or_build(sovits.dec, cache_dir, threads, spin=spin, arena=arena)
            reason = {"auto": "CPU", "onnx": f"{ENV}=onnx"}.get(mode, "OpenVINO unavailable: ONNX Runtime instead")
            backend = VocoderBackend(mode, generator, reason=reason)
            if n > 1:  # the parts on the one-thread graph (2-D: NCHWc kernels), short latents whole on `generator`
                single = generator if generator.threads == 1 else vocoder_onnx.load_or_build(sovits.dec, cache_dir, 1,
                                                                                            arena=arena)
                backend.split = SplitRunner(single, n, sovits.dec.receptive_frames, sovits.samples_per_frame,
                                            whole=generator, cores=cores)
        except Exception as exc:  # ImportError, a build or load error: MLX it is
            backend = VocoderBackend(mode, reason="fallback")
            backend.fail(f"ONNX Runtime backend unavailable: {type(exc).__name__}: {exc}")
    if backend.generator is not None and release_mlx:
        _release_mlx(sovits, backend)
    return backend


def from_runtime(sovits, runtime, cache_dir: str | os.PathLike | None = None) -> VocoderBackend:
    """:func:`build` with a :class:`~dora_primespeech_mlx.runtime.Runtime`'s vocoder choices (``vocoder``,
    ``vocoder_parts``, ``vocoder_spin``, ``vocoder_arena``, ``release_mlx``)."""
    plan = runtime.threads  # the engine's thread plan: the sessions' threads, and how many parts may run now
    return build(sovits, cache_dir, mode=runtime.vocoder, parts=runtime.vocoder_parts, spin=runtime.vocoder_spin,
                 arena=runtime.vocoder_arena, release_mlx=runtime.release_mlx,
                 threads=None if plan is None else plan.vocoder_threads(),
                 cores=None if plan is None else plan.vocoder_parts_now,
                 precision="bf16" if runtime.reduced("bf16") else "f32")


_SAID: set[str] = set()


def bf16_status() -> str | None:
    """Why the bfloat16 vocoder cannot run here (None: it can): the CPU's native bfloat16 products
    (``vocoder_openvino.BF16_FLAGS``, read at run time) and OpenVINO."""
    flags = half_gemv.cpu_flags()
    if isinstance(flags, str):
        return flags
    try:
        from . import vocoder_openvino
    except Exception as exc:  # pragma: no cover - the module itself imports nothing optional
        return f"{type(exc).__name__}: {exc}"
    if not any(f in flags for f in vocoder_openvino.BF16_FLAGS):
        return f"this CPU has none of {', '.join(vocoder_openvino.BF16_FLAGS)}"
    try:
        import openvino  # noqa: F401
    except ImportError:
        return "the openvino extra is not installed"
    return None


def _bf16(sovits, cache_dir, threads: int | None) -> VocoderBackend | None:
    """``PRIMESPEECH_PRECISION=bf16``: the generator on OpenVINO in bfloat16, or None (one INFO line per reason and
    process) where the CPU or the extra lacks it: the float32 choice then."""
    why = bf16_status()
    if why is None:
        try:
            from . import vocoder_openvino

            generator = vocoder_openvino.load_or_build(sovits.dec, cache_dir, threads, precision="bf16")
            return VocoderBackend("openvino", generator, reason="PRIMESPEECH_PRECISION=bf16")
        except Exception as exc:  # a compile error
            why = f"{type(exc).__name__}: {exc}"
    if why not in _SAID:
        _SAID.add(why)
        log.info("PRIMESPEECH_PRECISION=bf16 unavailable, the vocoder stays float32: %s", why)
    return None


def _openvino(sovits, cache_dir, threads: int | None) -> VocoderBackend | None:
    """``PRIMESPEECH_VOCODER=openvino``: the backend on OpenVINO, or None (one warning) where it is not installed
    or does not load the graph: ONNX Runtime then."""
    try:
        from . import vocoder_openvino

        generator = vocoder_openvino.load_or_build(sovits.dec, cache_dir, threads)
    except Exception as exc:  # ImportError (the extra is not installed), a compile error
        log.warning("SoVITS vocoder: OpenVINO unavailable (%s: %s); using ONNX Runtime", type(exc).__name__, exc)
        return None
    return VocoderBackend("openvino", generator, reason=f"{ENV}=openvino")


def auto_parts(threads: int) -> int:
    """``PRIMESPEECH_VOCODER_PARTS=auto``: two parts at two threads, else whole. Two one-thread runs side by side beat
    one run with two intra-op threads from ~100 latent frames (``models/vocoder_split``,
    ``tests/tools/vocoder_cut_sweep.py``); with more threads four parts won on the vocoder alone but lost end to end
    (docs/performance.md, "On a 16-vCPU Intel Xeon with AVX-512, alternated"), so there ONNX Runtime's own threads
    run it (``threads`` 0: all cores)."""
    return 2 if threads == 2 else 1


def _release_mlx(sovits, backend: VocoderBackend) -> None:
    """Drop the MLX generator weights of ``sovits`` when its converted file can give them back."""
    weights_file = getattr(sovits, "weights_file", None)
    if weights_file is None or not Path(weights_file).is_file() or not backend.wants_onnx():
        return
    gen = backend.generator
    backend.mlx_weights = MLXWeights(sovits, weights_file, gen.digest, gen.layout)
    backend.mlx_weights.drop()
    trim_heap()


def status(sovits) -> dict[str, Any]:
    """What runs the generator of ``sovits`` (``{"backend": "mlx"}`` when it was given none)."""
    backend = getattr(sovits, "vocoder_backend", None)
    return backend.status() if backend is not None else {"backend": "mlx", "mode": "none given"}
