"""Load models from original files or from converted MLX files, converting once and caching.

A converted model is a folder holding ``config.json`` (``{"kind": ..., "version": ..., "args": {...},
"source": ...}``), ``model.safetensors`` (the sanitized float32 weights) and ``manifest.json`` (written last,
see :mod:`.cache`). Loading a converted folder parses no pickle and does no key mapping. :func:`convert` writes
one, from weights that passed the reader's checks and are all finite; the ``load_*`` functions accept either
form and, given an original file, convert it into ``<root>/mlx/`` the first time (``root``: the model directory,
given by the caller; without one an original file is converted in memory). :func:`from_checkpoint` builds a model
from a checkpoint already read (``checkpoints.read_*``) the same way.

This is the one loading path (product and tests). Every loader takes the engine's :class:`~..runtime.Runtime`,
which decides at load how each model runs (:func:`load` lists the choices).
A model whose load changes how its weights are stored can be kept in that form on disk (``prepared``,
:func:`prepared_key`)."""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..paths import mlx_cache_dir
from ..runtime import DEFAULT, FROM_SETTINGS, Runtime
from . import cache as entries
from .checkpoints import RawCheckpoint, read_gpt, read_hf_dir, read_sovits, read_sv, sovits_needs_sv
from .torch_pickle import CheckpointError, pickle_bytes

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
PREPARED_FORMAT = 1  # bump when a load's transforms of the weights change (what the prepared form holds)
MAX_PREPARED = 8  # prepared models kept in the folder, the least recently used go first
KINDS = ("gpt", "sovits", "hubert", "bert", "sv")  # sv: the speaker-verification model of v2Pro voices


def _model_classes(kind: str):
    """(ArgsClass, ModelClass) of a model kind; imported lazily (MLX is heavy)."""
    if kind == "gpt":
        from ..models.gpt.model import T2SArgs, T2SModel

        return T2SArgs, T2SModel
    if kind == "sovits":
        from ..models.sovits.model import SoVITSArgs, SoVITSModel

        return SoVITSArgs, SoVITSModel
    if kind == "hubert":
        from ..models.hubert.model import HubertArgs, HubertModel

        return HubertArgs, HubertModel
    if kind == "bert":
        from ..models.bert.model import BertArgs, BertModel

        return BertArgs, BertModel
    if kind == "sv":
        from ..models.sv.model import ERes2NetV2, SVArgs

        return SVArgs, ERes2NetV2
    raise ValueError(f"unknown model kind {kind!r} (expected one of {', '.join(KINDS)})")


def detect_kind(path: str | os.PathLike) -> str:
    """Guess the model kind of an original file/folder or a converted folder."""
    path = Path(path)
    if path.is_dir():
        cfg = path / "config.json"
        if cfg.is_file():
            try:
                data = json.loads(cfg.read_text(encoding="utf-8"))
            except ValueError:
                raise CheckpointError(cfg, "invalid JSON") from None
            if "kind" in data and "args" in data:
                return data["kind"]
            model_type = data.get("model_type")
            if model_type in ("hubert", "bert"):
                return model_type
        raise CheckpointError(path, "cannot tell which model this folder holds (no usable config.json)")
    if path.suffix == ".ckpt":  # a GPT, or the speaker-verification state dict (tell them by tensor names)
        try:
            names = pickle_bytes(path)
        except CheckpointError:
            return "gpt"  # reading it as a GPT reports what is wrong with the file
        return "sv" if b"layer3_ds" in names and b"ar_text_embedding" not in names else "gpt"
    if path.suffix == ".pth":
        return "sovits"
    raise CheckpointError(path, "cannot tell the model kind: expected a .ckpt, a .pth or a model folder")


def read_original(path: str | os.PathLike, kind: str) -> RawCheckpoint:
    if kind == "gpt":
        return read_gpt(path)
    if kind == "sovits":
        return read_sovits(path)
    if kind == "sv":
        return read_sv(path)
    return read_hf_dir(path, kind)


def is_converted(path: str | os.PathLike) -> bool:
    path = Path(path)
    return (path / "model.safetensors").is_file() and (path / "config.json").is_file() and _is_ours(path)


def _is_ours(path: Path) -> bool:
    try:
        data = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "kind" in data and "args" in data


def _args_dict(args: Any) -> dict:
    if hasattr(args, "to_dict"):
        return args.to_dict()
    from dataclasses import asdict

    return asdict(args)


def sanitized(raw: RawCheckpoint) -> tuple[Any, dict[str, np.ndarray]]:
    """(args, sanitized float32 weights) of an original checkpoint."""
    args_cls, model_cls = _model_classes(raw.kind)
    if raw.kind == "sovits":
        args = args_cls.from_config(raw.config, version=raw.version, weights=raw.weights)
    else:
        args = args_cls.from_config(raw.config)
    weights = model_cls.sanitize(dict(raw.weights))
    if hasattr(args, "check_weights"):
        args.check_weights(weights)
    check_finite(raw.path, weights)
    return args, weights


def check_finite(source, weights: dict[str, np.ndarray]) -> None:
    """Refuse weights holding NaN or infinity (a damaged or hostile file): nothing non-finite is converted,
    cached or loaded."""
    for name, w in weights.items():
        arr = np.asarray(w)
        if arr.dtype.kind in "fc" and arr.size and not np.isfinite(arr).all():
            raise CheckpointError(source, f"weight {name!r} holds NaN or infinite values")


def _finish(kind: str, model, runtime: Runtime) -> None:
    """Load-time choices from ``runtime``: the GPT's decoder, the other models' ``prepare`` (derived weights,
    storage, the convolutions' form)."""
    if kind == "gpt":
        from ..models.gpt.decode import make_decoder

        model.decoder = make_decoder(model, runtime)
    elif kind == "sovits":
        model.prepare(runtime.conv_impl)
    elif kind == "bert":
        model.prepare(runtime)
    elif hasattr(model, "prepare"):
        model.prepare()


def from_checkpoint(raw: RawCheckpoint, runtime: Runtime = DEFAULT):
    """The model of an original checkpoint already read (``checkpoints.read_gpt``/``read_sovits``/
    ``read_hf_dir``), built as :func:`load` builds it under ``runtime`` (see the module docstring)."""
    args, weights = sanitized(raw)
    return _build(raw.kind, args, weights, raw.path, runtime)


def _build(kind: str, args: Any, weights, source=None, runtime: Runtime = DEFAULT):
    """The model of ``kind`` with ``weights``: a dict (emptied as it is read) or an iterable of
    (name, array) pairs (numpy or MLX). Arrays become MLX arrays one at a time and each numpy source is
    dropped once copied, so no second full copy of the weights builds up; the freed heap is handed
    back to the OS afterwards (``trim_heap``)."""
    import mlx.core as mx

    from ..models.shared.storage import trim_heap

    _, model_cls = _model_classes(kind)
    model = model_cls(args)  # MLX initialises lazily: the random init is never computed
    if isinstance(weights, dict):  # consumed: each numpy array is dropped once copied
        items = ((k, weights.pop(k)) for k in list(weights))
    else:
        items = iter(weights)
    try:
        model.load_weights([(k, v if isinstance(v, mx.array) else mx.array(v)) for k, v in items], strict=True)
    except ValueError as exc:
        raise CheckpointError(source, f"{kind} weights do not fit the config: {exc}") from None
    del items, weights  # the model holds the only references: prepare() may replace them unevaluated
    _finish(kind, model, runtime)
    model.eval()
    mx.eval(model.parameters())
    gc.collect()
    trim_heap()
    return model


def _read_converted(path: Path):
    """(name, mx.array) pairs of a converted ``model.safetensors``.

    ``mx.load`` reads each tensor straight into its MLX buffer: no numpy copy, and no memory map (a mapped file
    counts in RSS while it is open: safetensors' ``safe_open`` + ``get_tensor`` peak well above what the loaded
    models hold; this peaks at about that)."""
    import mlx.core as mx

    try:
        weights = mx.load(str(path), format="safetensors")
    except (OSError, ValueError, RuntimeError) as exc:
        raise CheckpointError(path, f"corrupt converted weights ({exc})") from None
    return list(weights.items())


def prepared_key(kind: str, weights_file: Path, runtime: Runtime) -> str:
    """The key (hex SHA-256) of a model's prepared form; OSError when the file cannot be read.

    The prepared form (``PRIMESPEECH_PREPARED_CACHE``): a model whose load changes how its weights are stored (float32
    weights kept as float16: RoBERTa's and the GPT's after checking each is a float16 value, CNHubert's storage) is
    written, as loaded, to ``<folder>/<kind>-<digest>.safetensors``; a later load under the same choices reads it
    instead of the float32 file, the check and the cast, and holds exactly the arrays a load from the float32 file
    holds. The key covers :data:`PREPARED_FORMAT`, the package version, the converted weights file's stamp
    (``cache.source_stamp``: size, times, the SHA-256 of each end), the runtime's choices, the MLX device and
    whether the float16 kernels are there; the file holds its key, and one that cannot be read, lacks a weight, or
    was written for another key is ignored (DEBUG) and written again."""
    import mlx.core as mx

    from ..models.kernels import half_gemv  # (MLX is heavy: imported lazily, as the models are)

    stamp = entries.source_stamp(weights_file)
    stamp.pop("path")  # (the file's content counts, not where it is)
    kernels = None  # whether the float16 kernels are there: what the GPT's and RoBERTa's choice of storage reads
    if kind == "gpt":
        kernels = half_gemv.kernel(runtime.isa, runtime.gpt_half) is not None
    elif kind == "bert":
        kernels = mx.default_device().type == mx.cpu and half_gemv.library(runtime.isa, runtime.threads) is not None
    parts = {"format": PREPARED_FORMAT, "package": __version__, "kind": kind, "weights": stamp,
             "runtime": {f: repr(getattr(runtime, f)) for f in (*FROM_SETTINGS, "fused_step")},
             "device": str(mx.default_device()), "kernels": kernels}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def prepared_file(folder: Path, kind: str, key: str) -> Path:
    return Path(folder) / f"{kind}-{key[:32]}.safetensors"


def _read_prepared(path: Path, key: str, model) -> dict | None:
    """The weights (name -> mx.array) of a prepared form written for ``key`` holding every weight of ``model``, else
    None (absent; unreadable, another key's or incomplete: DEBUG)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    if not path.is_file():
        return None
    try:
        weights, meta = mx.load(str(path), format="safetensors", return_metadata=True)
        if meta.get("key") != key:
            raise ValueError("written for another key")
        shapes = {k: tuple(v.shape) for k, v in tree_flatten(model.parameters())}
        if {k: tuple(v.shape) for k, v in weights.items()} != shapes:
            raise ValueError("its weights are not the model's")
    except (OSError, ValueError, RuntimeError) as exc:
        log.debug("prepared form %s ignored: %s", path, exc)
        return None
    return weights


def _store_prepared(path: Path, key: str, model) -> None:
    """Write ``model``'s weights as they are now to ``path`` (whole: a partial file renamed into place); a folder
    that cannot be written is skipped (DEBUG). Keeps the :data:`MAX_PREPARED` most recently used files."""
    import threading

    import mlx.core as mx
    from mlx.utils import tree_flatten

    partial = path.with_name(f".{path.stem}.{os.getpid()}.{threading.get_ident()}.part.safetensors")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        mx.save_safetensors(str(partial), dict(tree_flatten(model.parameters())), metadata={"key": key})
        os.replace(partial, path)
        olds = sorted((p for p in path.parent.glob("*.safetensors") if p != path and not p.name.startswith(".")),
                      key=lambda p: p.stat().st_mtime)
        for old in olds[: max(0, len(olds) + 1 - MAX_PREPARED)]:
            old.unlink(missing_ok=True)
    except (OSError, RuntimeError, ValueError) as exc:  # (MLX reports a file it cannot write as RuntimeError)
        log.debug("prepared form %s not written: %s", path, exc)
        try:
            partial.unlink(missing_ok=True)
        except OSError:
            pass


def _load_prepared(kind: str, args: Any, converted: Path, runtime: Runtime, prepared: Path | None):
    """(model, store) of a converted folder: the model from its prepared form when ``prepared`` holds one for these
    choices (``store`` None), else from its float32 weights, with ``store(model)`` writing its prepared form once the
    load is done (the caller's ``after`` included) when the load changed how a weight is stored (else None)."""
    from mlx.utils import tree_flatten

    weights_file = converted / "model.safetensors"
    key = target = None
    if prepared is not None:
        try:
            key = prepared_key(kind, weights_file, runtime)
            target = prepared_file(prepared, kind, key)
        except OSError as exc:
            log.debug("no prepared form for %s: %s", weights_file, exc)
    if target is not None:
        _, model_cls = _model_classes(kind)
        weights = _read_prepared(target, key, model_cls(args))
        if weights is not None:
            model = _build(kind, args, weights, converted, runtime)
            try:
                os.utime(target)  # the most recently used
            except OSError:
                pass
            return model, None
    weights = dict(_read_converted(weights_file))  # (a dict: _build empties it, the model holds the only references)
    stored = {k: v.dtype for k, v in weights.items()}
    model = _build(kind, args, weights, converted, runtime)
    if target is None:
        return model, None

    def store(model) -> None:
        if any(v.dtype != stored.get(k) for k, v in tree_flatten(model.parameters())):
            _store_prepared(target, key, model)  # the load changed how a weight is stored: keep that form

    return model, store


def convert(src: str | os.PathLike, dst: str | os.PathLike, kind: str | None = None) -> Path:
    """Convert an original checkpoint (``.ckpt``, ``.pth`` or a Hugging Face folder) to a converted
    MLX folder ``dst`` (written atomically: a failure leaves no partial folder)."""
    from safetensors.numpy import save_file

    src, dst = Path(src), Path(dst)
    kind = kind or detect_kind(src)
    raw = read_original(src, kind)
    args, weights = sanitized(raw)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        save_file({k: np.ascontiguousarray(v) for k, v in weights.items()}, str(tmp / "model.safetensors"))
        meta = {
            "format_version": FORMAT_VERSION,
            "kind": kind,
            "version": raw.version,
            "args": _args_dict(args),
            "source": str(src),
        }
        (tmp / "config.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False), encoding="utf-8")
        # Tokenizer files travel with a converted BERT.
        if kind == "bert":
            for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
                if (src / name).is_file():
                    shutil.copy2(src / name, tmp / name)
        entries.write_manifest(tmp, kind, src)  # last: the folder is complete
        if dst.exists():
            shutil.rmtree(dst)
        os.replace(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dst


def onnx_cache_dir(sovits_path: str | os.PathLike, root: Path) -> Path:
    """Where the ONNX graph of a SoVITS model is cached: its converted folder (the given folder when it is a
    converted one, else the folder this loader converted the original file into under the model directory
    ``root``), or ``<root>/mlx/onnx``."""
    p = Path(sovits_path)
    if p.is_dir() and (p / "model.safetensors").is_file():
        return p
    if p.is_file():
        target = _cache_path(p, "sovits", root)
        if entries.is_complete(target):
            return target
    return mlx_cache_dir(root) / "onnx"


def _cache_path(src: Path, kind: str, root: Path) -> Path:
    st = src.stat()
    key = f"{src.resolve()}|{st.st_size}|{int(st.st_mtime)}|{FORMAT_VERSION}"
    digest = hashlib.sha1(key.encode()).hexdigest()[:12]
    return mlx_cache_dir(root) / f"{kind}-{src.stem}-{digest}"


def load(path: str | os.PathLike, kind: str | None = None, cache: bool = True, root: Path | None = None,
         runtime: Runtime = DEFAULT, keep_converted: int = entries.MAX_ENTRIES, prepared: Path | None = None,
         after=None):
    """Load a model of ``kind`` from an original or converted path under ``runtime``: an original file is converted
    once into the model directory ``root``'s cache (``cache=False`` or no ``root``: converted in memory), which then
    keeps at most ``keep_converted`` per-request checkpoints (``PRIMESPEECH_CONVERTED_CACHE``, passed by the engine;
    :func:`.cache.prune`).

    The runtime (default: every choice automatic) decides at load:

    - GPT: which :class:`~..models.gpt.model.Decoder` runs its steps (``t2s_decode``, ``t2s_compile``; the numpy one
      with the kernels' ``isa``, ``gpt_half``, ``gpt_prefill``, ``fused_step``), kept in ``model.decoder``; with
      ``decoder_at_load`` the numpy decoder's weights are built while loading;
    - SoVITS: the convolutions' form (``conv_impl``; the vocoder backend is built by its owner, ``vocoder.build``);
    - BERT: float16 weights (``bert_half``) and the numpy path's kernels (``isa``, ``bert_gemm``).

    ``prepared``: the folder of prepared forms (module docstring; None: none read or written). ``after``: called with
    the model before its prepared form is written (the GPT's decoder weights, :func:`load_gpt`)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(path, "not found")
    kind = kind or detect_kind(path)
    if kind not in KINDS:
        raise ValueError(f"model kind {kind!r}: expected one of {', '.join(KINDS)}")
    entry = fresh = False
    if path.is_dir() and is_converted(path):
        converted = path
    else:
        if not cache or root is None:
            return from_checkpoint(read_original(path, kind), runtime)
        converted, entry = _cache_path(path, kind, root), True
        if entries.is_complete(converted):
            entries.mark_used(converted)
        else:  # absent, or not written whole (a crash, an older version): converted again
            try:
                convert(path, converted, kind)
                fresh = True
                log.info("converted %s -> %s", path, converted)
            except OSError as exc:  # read-only model dir: convert in memory
                log.warning("cannot cache the converted %s (%s); converting in memory", path, exc)
                return from_checkpoint(read_original(path, kind), runtime)
    try:
        meta = json.loads((converted / "config.json").read_text(encoding="utf-8"))
        if meta.get("kind") != kind:
            raise CheckpointError(converted, f"holds a {meta.get('kind')} model, expected {kind}")
        args_cls, _ = _model_classes(kind)
        args = args_cls.from_dict(meta["args"]) if hasattr(args_cls, "from_dict") else args_cls(**meta["args"])
        model, store = _load_prepared(kind, args, converted, runtime, prepared)
    except (CheckpointError, OSError, ValueError, KeyError, TypeError):
        if entry:  # a cache entry that does not load is never served again
            entries.discard(converted)
        raise
    model.weights_file = converted / "model.safetensors"  # where weights dropped later can be read back
    if entry:
        entries.hold(converted, model)
        if fresh:
            entries.prune(root, keep_converted, protect=converted)
    if after is not None:
        after(model)
    if store is not None:
        store(model)
    return model


def load_gpt(path, *, runtime: Runtime = DEFAULT, **kw):
    """The GPT (``T2SModel``) with its decoder chosen now by the runtime's ``t2s_decode`` (``auto``: numpy on the
    CPU, compiled MLX on a GPU) and ``t2s_compile``. With ``decoder_at_load`` the numpy decoder's weights (float16
    where they are float16 values) are built here."""
    return load(path, "gpt", runtime=runtime, after=_decoder_weights if runtime.decoder_at_load else None, **kw)


def _decoder_weights(model) -> None:
    """The numpy decoder's weights while loading (``decoder_at_load``): float16 where they are float16 values."""
    if getattr(model.decoder, "kind", None) == "numpy":
        from ..models.shared.storage import trim_heap

        model.decoder.warmup()  # its float16 weights now, not at the first token: the float32 ones go back
        trim_heap()  # before the other models load, which lowers the peak RSS (docs/memory.md, "The levers")


def load_sovits(path, **kw):
    return load(path, "sovits", **kw)


def load_hubert(path, **kw):
    return load(path, "hubert", **kw)


def load_sv(path, **kw):
    """The speaker-verification model (ERes2NetV2) of v2Pro voices, from the original ``.ckpt`` or a
    converted folder (converted once into the cache)."""
    return load(path, "sv", **kw)


def load_bert(path, **kw):
    """(BertModel, BertTokenizer) from an original or converted folder (the tokenizer files travel); float16
    weights as the runtime's ``bert_half`` says (``BertModel.prepare``)."""
    from ..models.bert.model import BertTokenizer

    path = Path(path)
    model = load(path, "bert", **kw)
    return model, BertTokenizer.from_dir(path)


def convert_voice(spec, root: Path) -> None:
    """Convert (and cache) every model file a voice uses, so the node's start parses no pickle."""
    from tqdm import tqdm

    items = [("gpt", spec.gpt), ("sovits", spec.sovits), ("hubert", spec.hubert), ("bert", spec.bert)]
    sv = getattr(spec, "sv", None)
    if sv is not None and sovits_needs_sv(spec.sovits):  # v2Pro / v2ProPlus: the speaker-verification model too
        items.append(("sv", sv))
    for kind, path in tqdm(items, desc=f"converting {spec.name}", unit="model"):
        if Path(path).is_dir() and is_converted(path):
            continue
        target = _cache_path(Path(path), kind, root)
        if not entries.is_complete(target):
            convert(path, target, kind)
