"""The SoVITS generator (vocoder) on OpenVINO's CPU plugin (oneDNN kernels): ``PRIMESPEECH_VOCODER=openvino``.

The graph is the one :mod:`.vocoder_onnx` builds and caches (the 2-D layout, OpenVINO's faster one at 1 and 2 threads
on the 2-core AVX-512 Xeon VM of docs/performance.md); OpenVINO compiles it with float32 inference precision. Its
default precision on CPUs with AMX or AVX-512 BF16 is bfloat16, which would change the audio, so the hint is always
set. ``openvino`` is an optional extra (``pip install "dora-primespeech-mlx[openvino]"``, ~180 MB installed);
without it, or on any failure, :func:`.vocoder.build` falls back to ONNX Runtime."""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

from . import vocoder_onnx

LAYOUT = "2d"  # the graph layout OpenVINO runs, the faster of the two there (docs/performance.md, "On OpenVINO")


PRECISIONS = ("f32", "bf16")
BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # the CPU flags with native bfloat16 products (Zen 4, Sapphire Rapids)


def load_or_build(dec, cache_dir: str | os.PathLike | None, threads: int | None = None,
                  precision: str = "f32") -> OpenVinoGenerator:
    """The generator ``dec`` on OpenVINO with ``threads`` threads (None: the package's thread setting, else every
    core), from the graph :func:`.vocoder_onnx.load_or_build` caches (built there when missing). ``precision``:
    ``f32`` (the default: the same audio as ONNX Runtime within the fixtures' tolerance) or ``bf16`` (the opt-in
    ``PRIMESPEECH_PRECISION=bf16``: OpenVINO's bfloat16 products, float32 accumulation, where the CPU has them)."""
    n = vocoder_onnx.resolve_threads(threads) or (os.cpu_count() or 1)

    def factory(model):
        return OpenVinoGenerator(model, n, precision)

    return vocoder_onnx.load_or_build(dec, cache_dir, threads, layout=LAYOUT, factory=factory)


def _config(threads: int, precision: str = "f32") -> dict[str, Any]:
    return {"INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY",
            "NUM_STREAMS": 1}


class OpenVinoGenerator:
    """The generator compiled by OpenVINO for the CPU. ``__call__(z, ge)`` with numpy float32 arrays, like
    :class:`.vocoder_onnx.OnnxGenerator`; callable from several threads at once (one infer request per thread)."""

    def __init__(self, model: str | os.PathLike | bytes, threads: int, precision: str = "f32"):
        import openvino as ov

        if precision not in PRECISIONS:
            raise ValueError(f"OpenVINO vocoder precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
        self.threads = max(1, int(threads))
        self.precision = precision
        core = ov.Core()
        if isinstance(model, bytes):  # a graph kept in memory (no writable cache): compiled from a scratch file
            fd, tmp = tempfile.mkstemp(suffix=".onnx")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(model)
                self.compiled = core.compile_model(tmp, "CPU", _config(self.threads, precision))
            finally:
                os.unlink(tmp)
        else:
            self.compiled = core.compile_model(str(model), "CPU", _config(self.threads, precision))
        got = str(self.compiled.get_property("INFERENCE_PRECISION_HINT"))
        want = ("f32", "float32") if precision == "f32" else ("bf16", "bfloat16")
        if not any(w in got for w in want):
            raise RuntimeError(f"OpenVINO compiled the vocoder with {got} precision, not {precision}")
        self.path = None if isinstance(model, bytes) else Path(model)
        self.version = ov.get_version()
        self.digest: str | None = None  # set by load_or_build
        self.layout = LAYOUT
        self._local = threading.local()

    def __call__(self, z: np.ndarray, ge: np.ndarray) -> np.ndarray:
        inputs = vocoder_onnx.generator_inputs(z, ge)
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self.compiled.create_infer_request()
        out = request.infer(inputs)
        return np.array(out[self.compiled.output(0)], dtype=np.float32, copy=True)

    def describe(self) -> dict[str, Any]:
        return {"runtime": "openvino", "threads": self.threads, "layout": self.layout, "openvino": self.version,
                "precision": self.precision, "path": None if self.path is None else str(self.path)}
