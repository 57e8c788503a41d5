"""CoreML runtime for the exported encoders (macOS): load a package, pad inputs to a bucket, predict,
crop the outputs.

* :func:`load_model` — ``ct.models.MLModel`` with the compute units of ``PRIMESPEECH_COREML_COMPUTE_UNITS``
  (``CPU_AND_NE`` by default; ``ALL``, ``CPU_AND_GPU``, ``CPU_ONLY``). The compiled model (``.mlmodelc``) is
  kept next to the package and loaded directly next time, so the on-device compile happens once.
* :class:`CoreMLHubert` — ``features(wav16k) -> (1, hidden, T)``: the 0.6 s zero tail is appended (as
  ``models.hubert.model.prompt_features`` does), the waveform is zero-padded to the smallest bucket that
  holds it, and the frames beyond ``num_frames(n)`` are cropped.
* :class:`CoreMLBert` — ``hidden(ids) -> (L, hidden)``: ``hidden_states[-3]`` of one tokenised text,
  padded with the pad id to a token bucket and cropped.

Inputs longer than the largest bucket raise :class:`BucketError` (the caller runs MLX for that input);
every other problem raises :class:`CoreMLError` or the underlying exception."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..runtime import CHOICES
from .export import PROMPT_TAIL_SAMPLES, ExportSpec, _ct, read_package_spec

log = logging.getLogger(__name__)

COMPUTE_UNITS_ENV = "PRIMESPEECH_COREML_COMPUTE_UNITS"
COMPUTE_UNITS = CHOICES["coreml_compute_units"]
DEFAULT_COMPUTE_UNITS = COMPUTE_UNITS[0]


class CoreMLError(RuntimeError):
    """CoreML cannot be used here (not macOS, package unusable, prediction failed)."""


class BucketError(ValueError):
    """The exported package cannot take this input (longer than the largest bucket, or token ids that
    contain the pad id); the caller answers it another way."""


def compute_units(name: str | None = None) -> str:
    """The compute-unit name ``name`` (the runtime's ``coreml_compute_units``; None: the default), validated."""
    value = (name or DEFAULT_COMPUTE_UNITS).strip().upper()
    if value not in COMPUTE_UNITS:
        raise ValueError(f"{COMPUTE_UNITS_ENV}={value!r} is invalid: use one of {', '.join(COMPUTE_UNITS)}")
    return value


def prediction_supported() -> bool:
    """CoreML can predict only on macOS."""
    return sys.platform == "darwin"


def compiled_path(package: str | os.PathLike) -> Path:
    package = Path(package)
    return package.with_name(package.name.removesuffix(".mlpackage") + ".mlmodelc")


def load_model(package: str | os.PathLike, units: str | None = None):
    """A prediction-ready model of ``package`` (compiled once, the ``.mlmodelc`` cached beside it)."""
    package = Path(package)
    if not prediction_supported():
        raise CoreMLError(f"CoreML prediction needs macOS (this is {sys.platform})")
    if not package.is_dir():
        raise CoreMLError(f"CoreML package {package} not found")
    try:
        ct = _ct()
    except ImportError as exc:
        raise CoreMLError(f"coremltools is not installed ({exc}); pip install 'dora-primespeech-mlx[coreml]'") from None
    cu = getattr(ct.ComputeUnit, compute_units(units))
    compiled = compiled_path(package)
    if compiled.is_dir() and compiled.stat().st_mtime >= package.stat().st_mtime:
        try:
            return ct.models.CompiledMLModel(str(compiled), compute_units=cu)
        except Exception as exc:  # stale or broken cache: recompile below
            log.info("recompiling %s (cached %s unusable: %s)", package, compiled, exc)
    model = ct.models.MLModel(str(package), compute_units=cu)
    try:
        src = Path(model.get_compiled_model_path())
        tmp = Path(tempfile.mkdtemp(prefix=f".{compiled.name}.", dir=compiled.parent))
        shutil.copytree(src, tmp / compiled.name)
        if compiled.exists():
            shutil.rmtree(compiled)
        os.replace(tmp / compiled.name, compiled)
        shutil.rmtree(tmp, ignore_errors=True)
    except Exception as exc:  # the cache is an optimisation only
        log.debug("cannot cache the compiled model of %s: %s", package, exc)
    return model


def pick_bucket(n: int, buckets: Sequence[int]) -> int:
    for b in sorted(buckets):
        if n <= b:
            return int(b)
    raise BucketError(f"input of length {n} exceeds the largest CoreML bucket {max(buckets)}")


class _Encoder:
    kind = ""

    def __init__(self, package: str | os.PathLike, units: str | None = None, model=None):
        self.package = Path(package)
        self.spec: ExportSpec = read_package_spec(self.package)
        if self.spec.kind != self.kind:
            raise CoreMLError(f"{self.package} holds a {self.spec.kind} encoder, expected {self.kind}")
        self.units = compute_units(units)
        self.model = model if model is not None else load_model(self.package, self.units)

    def _predict(self, inputs: dict[str, np.ndarray], output: str) -> np.ndarray:
        out = self.model.predict(inputs)
        if output not in out:
            raise CoreMLError(f"{self.package}: prediction has no output {output!r} (got {sorted(out)})")
        return np.asarray(out[output], dtype=np.float32)


class CoreMLHubert(_Encoder):
    kind = "hubert"

    def num_frames(self, n: int) -> int:
        for k, s in zip(self.spec.args["conv_kernel"], self.spec.args["conv_stride"]):
            n = (n - int(k)) // int(s) + 1
        return max(n, 0)

    def last_hidden_state(self, wav: np.ndarray) -> np.ndarray:
        """Raw 16 kHz waveform (already carrying any tail) -> (1, hidden, T)."""
        wav = np.asarray(wav, dtype=np.float32).reshape(-1)
        n = wav.shape[0]
        T = self.num_frames(n)
        if T < 1:
            raise ValueError(f"waveform too short for HuBERT: {n} samples")
        b = pick_bucket(n, self.spec.buckets)
        x = np.zeros((1, b), dtype=np.float32)
        x[0, :n] = wav
        y = self._predict({"wav": x, "num_samples": np.array([n], dtype=np.int32)}, "last_hidden_state")
        if y.ndim != 4 or y.shape[-1] < T:
            raise CoreMLError(f"{self.package}: unexpected output shape {y.shape} for {T} frames")
        return np.ascontiguousarray(y[:, :, 0, :T])

    def features(self, wav16k: np.ndarray) -> np.ndarray:
        """Like ``models.hubert.model.prompt_features``: mono 16 kHz clip -> +0.6 s zeros -> (1, hidden, T)."""
        from ..models.audio import mono_clip

        wav = mono_clip(wav16k)
        return self.last_hidden_state(np.concatenate([wav, np.zeros(PROMPT_TAIL_SAMPLES, dtype=np.float32)]))


class CoreMLBert(_Encoder):
    kind = "bert"

    def hidden(self, ids: Sequence[int]) -> np.ndarray:
        """Token ids of one text (with [CLS]/[SEP]) -> ``hidden_states[-3]`` (L, hidden)."""
        ids = np.asarray(ids, dtype=np.int32).reshape(-1)
        L = ids.shape[0]
        if (ids == self.spec.pad_id).any():
            raise BucketError(f"token ids contain the pad id {self.spec.pad_id}; the in-graph mask would drop them")
        b = pick_bucket(L, self.spec.buckets)
        x = np.full((1, b), self.spec.pad_id, dtype=np.int32)
        x[0, :L] = ids
        y = self._predict({"input_ids": x}, "hidden")
        if y.ndim != 4 or y.shape[-1] < L:
            raise CoreMLError(f"{self.package}: unexpected output shape {y.shape} for {L} tokens")
        return np.ascontiguousarray(y[0, :, 0, :L].T)
