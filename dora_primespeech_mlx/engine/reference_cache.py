"""A voice's reference features on disk (``<cache dir>/references/reference-<digest>.npz``), so that a process
that starts the same voice again skips CNHubert, the prompt's RoBERTa features and the speaker embedding
(``PRIMESPEECH_REFERENCE_CACHE``; docs/performance.md, "Start-up").

The digest is the SHA-256 of everything the features come from: this format and the package version, the whole
reference clip's bytes, the stamp of each model file the recipe reads (SoVITS, CNHubert, RoBERTa, the v2Pro
speaker-verification model: ``convert.cache.source_stamp``: size, times and the SHA-256 of each end), the prompt
text and language, the models' symbol version, the g2pW choice (with its files' folders when on) and the runtime's
numeric choices. A file is written whole (a temporary file renamed into place) and holds its own key: one that cannot
be read, lacks a field, or was written for another key is ignored (a DEBUG line) and the features are computed
again. The folder keeps the :data:`MAX_FILES` most recently used files."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import os
import stat
from pathlib import Path

import mlx.core as mx
import numpy as np

from .. import __version__
from ..assets.catalog import VoiceSpec
from ..convert.cache import source_stamp
from ..runtime import FROM_SETTINGS, Runtime
from ..text.options import TextData
from .reference import Reference

log = logging.getLogger(__name__)

FORMAT = 1  # bump when what is stored, or how it is computed, changes
MAX_CLIP_BYTES = 64 << 20  # a clip of at most 10 s is far smaller; a larger file is refused by the build anyway
MAX_FILES = 64  # the folder keeps the features of this many voices, the least recently used go first (~100 kB each)
ARRAYS = ("prompt_semantic", "prompt_phones", "prompt_bert")  # each absent in reference-free mode


def reference_key(spec: VoiceSpec, prompt_lang: str, symbol_version: str, with_sv: bool, runtime: Runtime,
                  text_data: TextData) -> str:
    """The cache key (a hex SHA-256) of ``spec``'s reference features; OSError when a file cannot be read, or the
    clip is not a regular file of at most :data:`MAX_CLIP_BYTES` (the features are then computed, and the clip
    checked, as without this cache)."""
    st = os.stat(spec.reference)
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_CLIP_BYTES:
        raise OSError(f"{spec.reference}: not a regular file of at most {MAX_CLIP_BYTES} bytes")
    clip = hashlib.sha256(Path(spec.reference).read_bytes()).hexdigest()  # a clip is at most 10 s: read it whole
    models = {kind: source_stamp(path) for kind, path in (("sovits", spec.sovits), ("hubert", spec.hubert),
                                                           ("bert", spec.bert), ("sv", spec.sv if with_sv else None))
              if path is not None}
    for stamp in models.values():
        stamp.pop("path")  # (the files' contents count, not where they are)
    parts = {
        "format": FORMAT, "package": __version__, "clip": clip, "models": models,
        "prompt_text": spec.prompt_text or "", "prompt_lang": prompt_lang, "symbols": symbol_version,
        "g2pw": dataclasses.asdict(text_data.g2pw) if text_data.g2pw.enabled else False,  # (off: its folder unread)
        "runtime": {f: repr(getattr(runtime, f)) for f in (*FROM_SETTINGS, "fused_step")},
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def cache_file(folder: Path, key: str) -> Path:
    return Path(folder) / f"reference-{key[:32]}.npz"


def load(folder: Path, key: str) -> Reference | None:
    """The features stored for ``key`` in ``folder``, or None (absent, unreadable, or another key's: DEBUG)."""
    path = cache_file(folder, key)
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            header = json.loads(str(z["header"]))
            if header.get("key") != key:
                raise ValueError("written for another key")
            arrays = {name: (np.array(z[name]) if name in z.files else None) for name in ARRAYS}
            ge = np.array(z["ge"])
        if (arrays["prompt_semantic"] is None) != (arrays["prompt_phones"] is None) or ge.ndim != 3:
            raise ValueError("incomplete")
        ref = Reference(arrays["prompt_semantic"], arrays["prompt_phones"], arrays["prompt_bert"],
                        str(header["prompt_norm_text"]), mx.array(ge), float(header["seconds"]))
        try:
            os.utime(path)  # recently used (:func:`prune` keeps the newest)
        except OSError:
            pass
        return ref
    except Exception as exc:  # noqa: BLE001 - any damage: compute the features again
        log.debug("reference cache %s ignored (%s: %s); computing the features again", path,
                  type(exc).__name__, exc)
        return None


def store(folder: Path, key: str, ref: Reference) -> Path | None:
    """Write ``ref`` for ``key`` into ``folder`` atomically; the path, or None when it could not be written
    (DEBUG: the features are then computed at the next start)."""
    path = cache_file(folder, key)
    arrays = {name: np.asarray(getattr(ref, name)) for name in ARRAYS if getattr(ref, name) is not None}
    arrays["ge"] = np.array(ref.ge)
    header = {"key": key, "prompt_norm_text": ref.prompt_norm_text, "seconds": ref.seconds}
    buf = io.BytesIO()
    np.savez(buf, header=np.array(json.dumps(header)), **arrays)
    partial = path.with_name(f"{path.name}.{os.getpid()}.part")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_bytes(buf.getvalue())
        os.replace(partial, path)
    except OSError as exc:
        log.debug("reference features not written to %s: %s", path, exc)
        partial.unlink(missing_ok=True)
        return None
    prune(Path(folder))
    return path


def prune(folder: Path, keep: int = MAX_FILES) -> int:
    """Delete all but the ``keep`` most recently used feature files of ``folder``; how many went."""
    files = []
    for p in folder.glob("reference-*.npz"):
        try:
            files.append((p.stat().st_mtime_ns, p))
        except OSError:
            continue
    gone = 0
    for _, p in sorted(files, reverse=True)[keep:]:
        try:
            p.unlink()
            gone += 1
        except OSError:
            pass
    return gone
