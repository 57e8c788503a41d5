"""The two encoders behind one interface: CNHubert (reference audio) and Chinese RoBERTa (Chinese text),
each on CoreML (macOS, Neural Engine) or MLX, with automatic per-encoder fallback to MLX.

CoreML is faster where it runs but may fail to export, load or predict; a failure switches only that encoder to
MLX, with one warning, so synthesis never fails because of CoreML. :class:`EncoderBackends` lists the API, the
modes and the fallback rules."""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..convert import load
from ..models.audio import mono_clip
from ..models.bert.model import BertTokenizer, _check_item, bert_features_batch, phone_features
from ..models.hubert.model import prompt_features
from ..runtime import DEFAULT, Runtime

log = logging.getLogger(__name__)

MODES = ("auto", "coreml", "mlx")
MODE_ENV = "PRIMESPEECH_ENCODERS"
KINDS = ("hubert", "bert")


def resolve_mode(mode: str = "auto") -> str:
    value = mode.strip().lower()
    if value not in MODES:
        raise ValueError(f"encoder mode {value!r} is invalid ({MODE_ENV}): use one of {', '.join(MODES)}")
    return value


def coreml_available() -> bool:
    """True on macOS with coremltools installed (what ``auto`` needs to pick CoreML)."""
    return sys.platform == "darwin" and importlib.util.find_spec("coremltools") is not None


def prepare_coreml(spec, root: Path | None = None) -> None:
    """On macOS with coremltools: export a voice's CoreML encoders once, at installation rather than at first use
    (``download_voice``'s ``after_convert``). A failure is logged: the MLX encoders still work, and the engine
    retries or falls back."""
    if not coreml_available():
        return
    from ..coreml.export import export_voice_encoders

    try:
        export_voice_encoders(spec, root)
    except Exception as exc:
        log.warning("CoreML export failed (%s); the MLX encoders will be used", exc)


class _Slot:
    """Per-encoder backend state."""

    def __init__(self, kind: str, want_coreml: bool):
        self.kind = kind
        self.backend = "coreml" if want_coreml else "mlx"
        self.coreml: Any = None  # runtime.CoreMLHubert / CoreMLBert once loaded
        self.package: Path | None = None
        self.fallback_reason: str | None = None
        self.coreml_calls = 0
        self.mlx_calls = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "fallback": self.fallback_reason is not None,
            "fallback_reason": self.fallback_reason,
            "package": str(self.package) if self.package else None,
            "coreml_calls": self.coreml_calls,
            "mlx_calls": self.mlx_calls,
        }


class EncoderBackends:
    """HuBERT and BERT features on CoreML or MLX. Thread-safe. What the engine calls::

        enc = EncoderBackends(hubert_path, bert_path, runtime=runtime, root=model_dir)
        enc.hubert_features(wav16k)             # mono 16 kHz float32 clip -> (1, 768, T) float32
                                                # (the 0.6 s zero tail is appended, like models.hubert.prompt_features)
        enc.bert_features(norm_text, word2ph)   # -> (hidden, n_phones) float32
        enc.bert_features_batch(items)          # [(norm_text, word2ph), ...] -> [(hidden, n_phones), ...]
        enc.bert_hidden_size                    # BERT width (1024 for chinese-roberta-wwm-ext-large)
        enc.status()                            # {"mode": ..., "hubert": {...}, "bert": {...}} for stats/status

    ``mode`` (default: the runtime's ``encoders``, ``PRIMESPEECH_ENCODERS``): ``mlx`` always uses MLX; ``coreml``
    tries CoreML on every platform (off macOS it falls back at once, with the warning); ``auto`` uses CoreML on
    macOS when coremltools is installed, MLX otherwise. The CoreML packages are exported from the model folders the
    first time (``coreml.export.ensure_package``, cached under ``<root>/coreml``, ``root`` the model directory;
    without one CoreML is not used) and the compiled models are cached next to them. The compute units are the
    runtime's ``coreml_compute_units`` unless given.

    Fallback: a CoreML failure while exporting, loading or predicting logs ONE warning for that encoder, switches
    that encoder to MLX for the rest of the process (``status()[kind]["backend"] == "mlx"`` with
    ``fallback_reason``), and the call that failed is answered by MLX. An input the package cannot take (longer
    than the largest bucket) is answered by MLX without switching.

    The MLX models are built lazily from the same folders (``convert.load``, with the runtime), or supplied by the
    caller (``mlx_hubert`` / ``mlx_bert``: zero-argument callables returning the ``HubertModel`` and the
    ``(BertModel, BertTokenizer)`` pair), so an engine that already caches its models can share them."""

    def __init__(
        self,
        hubert_path: str | os.PathLike | None = None,
        bert_path: str | os.PathLike | None = None,
        mode: str | None = None,
        root: Path | None = None,
        compute_units: str | None = None,
        runtime: Runtime = DEFAULT,
        precision: str = "fp16",
        mlx_hubert: Callable[[], Any] | None = None,
        mlx_bert: Callable[[], tuple[Any, Any]] | None = None,
        packages: dict[str, str | os.PathLike] | None = None,
    ):
        self.runtime = runtime
        self.mode = resolve_mode(mode if mode is not None else runtime.encoders)
        self.paths = {"hubert": Path(hubert_path) if hubert_path else None,
                      "bert": Path(bert_path) if bert_path else None}
        self.root = Path(root) if root else None
        self.precision = precision
        self.packages = {k: Path(v) for k, v in (packages or {}).items()}
        if self.mode != "mlx":
            from ..coreml.runtime import compute_units as _cu

            self.compute_units = _cu(compute_units or runtime.coreml_compute_units)  # a bad one is raised now
        else:
            self.compute_units = compute_units
        want = self.mode == "coreml" or (self.mode == "auto" and coreml_available())
        self._slots = {k: _Slot(k, want) for k in KINDS}
        self._mlx_loaders = {"hubert": mlx_hubert, "bert": mlx_bert}
        self._mlx: dict[str, Any] = {}
        self._tokenizer = None
        self._lock = threading.RLock()

    # ---- public API --------------------------------------------------------------------------
    def hubert_features(self, wav16k: np.ndarray) -> np.ndarray:
        """Mono 16 kHz clip (without the tail) -> (1, hidden, T) float32 SoVITS ``extract_latent`` input."""
        wav = mono_clip(wav16k)
        with self._lock:
            out = self._try_coreml("hubert", lambda enc: enc.features(wav))
            if out is not None:
                return out
            self._slots["hubert"].mlx_calls += 1
            return np.asarray(prompt_features(self._mlx_model("hubert"), wav), dtype=np.float32)

    def bert_features(self, norm_text: str, word2ph: Sequence[int]) -> np.ndarray:
        """(hidden, n_phones) float32 features of one Chinese segment."""
        return self.bert_features_batch([(norm_text, word2ph)])[0]

    def bert_features_batch(self, items: Sequence[tuple[str, Sequence[int]]]) -> list[np.ndarray]:
        """:meth:`bert_features` of several segments (MLX: one padded batch; CoreML: one call each)."""
        items = list(items)
        if not items:
            return []
        for norm_text, word2ph in items:
            _check_item(norm_text, word2ph)  # input errors are raised, not mistaken for CoreML failures
        with self._lock:
            out = self._try_coreml("bert", lambda enc: self._coreml_bert_batch(enc, items))
            if out is not None:
                return out
            model, tokenizer = self._mlx_model("bert")
            self._slots["bert"].mlx_calls += 1
            return bert_features_batch(model, tokenizer, items)

    @property
    def bert_hidden_size(self) -> int:
        with self._lock:
            slot = self._slots["bert"]
            if slot.coreml is not None:
                return int(slot.coreml.spec.args["hidden_size"])
            path = self.paths["bert"]
            if path is not None and (path / "config.json").is_file():
                import json

                cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
                cfg = cfg.get("args", cfg)  # converted folder or HF config
                if "hidden_size" in cfg:
                    return int(cfg["hidden_size"])
            return int(self._mlx_model("bert")[0].args.hidden_size)

    def status(self) -> dict[str, Any]:
        """For ``stats``/``status``: the mode, and per encoder its backend and any fallback reason. Read without
        the lock, which a HuBERT or BERT call (or a model load) holds for seconds: ``stats`` must not wait for
        them (each field is one attribute read; a count may be one call behind)."""
        return {
            "mode": self.mode,
            "compute_units": self.compute_units if self.mode != "mlx" else None,
            **{k: s.to_dict() for k, s in dict(self._slots).items()},
        }

    def load(self, kinds: Sequence[str] = KINDS) -> None:
        """Load (and on macOS export/compile) the encoders now instead of on first use."""
        with self._lock:
            for kind in kinds:
                if self._slots[kind].backend == "coreml":
                    try:
                        self._coreml(kind)
                    except Exception as exc:
                        self._fallback(kind, exc)
                if self._slots[kind].backend == "mlx":
                    self._mlx_model(kind)

    # ---- internals -----------------------------------------------------------------------------
    def _try_coreml(self, kind: str, fn: Callable[[Any], Any]):
        """fn(coreml encoder) on the CoreML backend, or None when MLX must answer."""
        slot = self._slots[kind]
        if slot.backend != "coreml":
            return None
        from ..coreml.runtime import BucketError

        try:
            result = fn(self._coreml(kind))
        except BucketError as exc:
            log.info("%s input does not fit the CoreML buckets (%s); using MLX for it", kind, exc)
            return None
        except Exception as exc:
            self._fallback(kind, exc)
            return None
        slot.coreml_calls += 1
        return result

    def _fallback(self, kind: str, exc: BaseException) -> None:
        slot = self._slots[kind]
        reason = f"{type(exc).__name__}: {exc}"
        slot.backend, slot.fallback_reason, slot.coreml = "mlx", reason, None
        log.warning("CoreML %s encoder failed (%s); using MLX for it from now on", kind, reason)

    def _coreml(self, kind: str):
        slot = self._slots[kind]
        if slot.coreml is None:
            from ..coreml import runtime

            package = self.packages.get(kind)
            if package is None:
                src = self.paths[kind]
                if src is None:
                    raise ValueError(f"no {kind} model folder given")
                if not runtime.prediction_supported():  # do not spend an export on a platform that cannot run it
                    raise runtime.CoreMLError(f"CoreML prediction needs macOS (this is {sys.platform})")
                from ..coreml.export import ensure_package

                if self.root is None:
                    raise runtime.CoreMLError("no model directory given to keep the exported CoreML package in")
                package = ensure_package(src, kind, self.precision, self.root)
            slot.package = Path(package)
            cls = runtime.CoreMLHubert if kind == "hubert" else runtime.CoreMLBert
            slot.coreml = cls(package, self.compute_units)
        return slot.coreml

    def _mlx_model(self, kind: str):
        if kind not in self._mlx:
            loader = self._mlx_loaders[kind]
            if loader is None:
                path = self.paths[kind]
                if path is None:
                    raise ValueError(f"no {kind} model folder given")
                fn = load.load_hubert if kind == "hubert" else load.load_bert

                def loader():
                    return fn(path, root=self.root, runtime=self.runtime)
            self._mlx[kind] = loader()
        return self._mlx[kind]

    def _bert_tokenizer(self):
        if self._tokenizer is None:
            if "bert" in self._mlx:
                self._tokenizer = self._mlx["bert"][1]
            else:
                if self.paths["bert"] is None:
                    raise ValueError("no bert model folder given (needed for the tokenizer)")
                self._tokenizer = BertTokenizer.from_dir(self.paths["bert"])
        return self._tokenizer

    def _coreml_bert_batch(self, enc, items: list[tuple[str, Sequence[int]]]) -> list[np.ndarray]:
        tok = self._bert_tokenizer()
        encoded = tok.encode_batch([t for t, _ in items])
        return [phone_features(enc.hidden(ids)[1:-1], w2p) for ids, (_, w2p) in zip(encoded, items)]
