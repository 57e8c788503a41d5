"""The converted-model cache: ``<model_dir>/mlx/<kind>-<stem>-<digest>/``, one folder per original file.

An entry is written whole or not at all: the converter fills a temporary folder beside it, writes
:data:`MANIFEST` last (the size and modification time of every file it wrote, and the original's
:func:`source_stamp`), and renames the folder into place. An entry is served only when its manifest is there,
every file it lists still has its size and time, and the original still has the stamp it was converted from;
anything else (a folder of an older version without a manifest, a truncated or rewritten file, a replaced
original, a crashed conversion) is converted again. The converter only writes weights that passed the reader's
checks and are finite (``convert.load``). Crashed conversions are swept (:func:`sweep_temporary`) and per-request
entries bounded (:func:`prune`)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from ..paths import mlx_cache_dir, originals_dir, user_voices_dir
from ..settings import Settings

MANIFEST = "manifest.json"
MANIFEST_VERSION = 2
TEMP_FOLDER_MAX_IDLE_SECONDS = 600  # a temporary folder unwritten this long is a killed conversion's
STAMP_BYTES = 1 << 20  # hashed at each end of an original file

_held: dict[str, int] = {}  # entry folder -> models loaded from it that are alive in this process
_lock = threading.Lock()


MAX_ENTRIES: int = Settings.max_converted_models  # converted per-request checkpoints kept: the setting's default


def _file_stamp(path: Path) -> list:
    """[size, mtime_ns, ctime_ns, SHA-256 of the first and last :data:`STAMP_BYTES`] of one file."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        h = hashlib.sha256(f.read(STAMP_BYTES))
        if st.st_size > STAMP_BYTES:
            f.seek(max(STAMP_BYTES, st.st_size - STAMP_BYTES))
            h.update(f.read(STAMP_BYTES))
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, h.hexdigest()]


def source_stamp(source: Path) -> dict:
    """What identifies an original (a checkpoint file, or a Hugging Face folder's files) cheaply and by content.
    OSError when it cannot be read.

    Per file: its size, modification time, status-change time (``st_ctime``, which no user call can set back:
    replacing or rewriting a file changes it even when ``touch -r`` restores the modification time) and the SHA-256
    of its first and last MiB (a different checkpoint differs in its pickle header and its zip directory). Hashing
    whole files instead would read gigabytes at each start."""
    source = Path(os.path.realpath(source))
    if source.is_dir():
        files = {p.name: _file_stamp(p) for p in sorted(source.iterdir()) if p.is_file()}
    else:
        files = {"": _file_stamp(source)}
    return {"path": str(source), "files": files}


def write_manifest(folder: Path, kind: str, source: Path) -> None:
    """Seal a finished conversion: record every file of ``folder`` and the original's stamp; written last."""
    files = {}
    for p in sorted(folder.iterdir()):
        if p.is_file() and p.name != MANIFEST:
            st = p.stat()
            files[p.name] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    meta = {"manifest_version": MANIFEST_VERSION, "kind": kind, "source": str(source), "files": files,
            "source_stamp": source_stamp(source), "weights": "finite"}
    tmp = folder / (MANIFEST + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / MANIFEST)


def manifest(entry: Path) -> dict[str, Any] | None:
    """The manifest of a complete entry, or None (missing, unreadable, a listed file changed, or the original
    is not the one it was converted from)."""
    try:
        meta = json.loads((entry / MANIFEST).read_text(encoding="utf-8"))
        files = meta["files"]
        if meta.get("manifest_version") != MANIFEST_VERSION or not {"config.json", "model.safetensors"} <= set(files):
            return None
        for name, stamp in files.items():
            st = (entry / name).stat()
            if st.st_size != stamp["size"] or st.st_mtime_ns != stamp["mtime_ns"]:
                return None
        recorded = meta["source_stamp"]
        if source_stamp(Path(recorded["path"])) != recorded:
            return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return meta


def is_complete(entry: Path) -> bool:
    return manifest(entry) is not None


def mark_used(entry: Path) -> None:
    """Record a use of ``entry``: its manifest's modification time orders the least recently used (the
    manifest's own time is not among the stamps it checks)."""
    try:
        os.utime(entry / MANIFEST)
    except OSError:
        pass
    sweep_temporary(entry.parent)


def _last_write(folder: Path) -> float:
    """The newest modification time of ``folder`` and the files in it."""
    newest = folder.stat().st_mtime
    for p in folder.iterdir():
        try:
            newest = max(newest, p.stat().st_mtime)
        except OSError:
            continue
    return newest


def sweep_temporary(base: Path) -> list[Path]:
    """Remove the temporary folders (``.<name>.*``) under ``base`` unwritten for :data:`TEMP_FOLDER_MAX_IDLE_SECONDS`: a
    killed conversion's. A live conversion keeps writing into its folder and is left alone."""
    removed = []
    now = time.time()
    try:
        temps = [p for p in base.iterdir() if p.name.startswith(".") and p.is_dir()]
    except OSError:
        return removed
    for p in temps:
        try:
            if now - _last_write(p) > TEMP_FOLDER_MAX_IDLE_SECONDS:
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
        except OSError:
            continue
    return removed


def last_used(entry: Path) -> float:
    try:
        return os.stat(entry / MANIFEST).st_mtime
    except OSError:
        try:
            return os.stat(entry).st_mtime
        except OSError:
            return 0.0


def hold(entry: Path, model: Any) -> None:
    """Keep ``entry`` while ``model`` (loaded from it, which may read its weights back later) is alive."""
    key = str(entry)
    with _lock:
        _held[key] = _held.get(key, 0) + 1
    try:
        weakref.finalize(model, _release, key)
    except TypeError:  # not weak-referenceable: held for the life of the process
        pass


def _release(key: str) -> None:
    with _lock:
        n = _held.get(key, 0) - 1
        if n > 0:
            _held[key] = n
        else:
            _held.pop(key, None)


def is_held(entry: Path) -> bool:
    with _lock:
        return str(entry) in _held


def discard(entry: Path) -> None:
    """Remove an entry (renamed away first, so no reader finds it half deleted)."""
    gone = entry.with_name(f".{entry.name}.discarded-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.replace(entry, gone)
    except OSError:
        return
    shutil.rmtree(gone, ignore_errors=True)


def _per_request(meta: dict | None, root: Path) -> bool:
    """Whether an entry converts a per-request checkpoint (neither the catalog's nor a user voice's file)."""
    if meta is None:
        return True  # incomplete: never served, always the first to go
    source = Path(str(meta.get("source", "")))
    for pinned in (originals_dir(root), user_voices_dir(root)):
        try:
            source.resolve().relative_to(pinned.resolve())
            return False
        except (ValueError, OSError):
            continue
    return True


def prune(root: Path, keep: int, protect: Path | None = None) -> list[Path]:
    """Remove the least recently used per-request entries beyond ``keep`` (``PRIMESPEECH_CONVERTED_CACHE``),
    never ``protect`` nor an entry held by a live model; also crashed conversions' temporary folders.
    Returns the entries removed.

    Per-request entries are those of ``VOICE:TRAINED`` files: any original outside ``<model_dir>/moyoyo`` and
    ``<model_dir>/voices``; the catalog's voices and the user voices are not counted. A temporary folder in which
    nothing was written for :data:`TEMP_FOLDER_MAX_IDLE_SECONDS` is a killed conversion's (a live one writes its
    files within seconds of creating it)."""
    base = mlx_cache_dir(root)
    sweep_temporary(base)
    try:
        folders = [p for p in base.iterdir() if p.is_dir()]
    except OSError:
        return []
    candidates = []
    for p in folders:
        if p.name.startswith("."):
            continue
        if not (p / "config.json").exists() and not (p / MANIFEST).exists():
            continue  # not a converted model (e.g. the ONNX folder)
        if _per_request(manifest(p), root):
            candidates.append(p)
    candidates.sort(key=last_used, reverse=True)
    removed = []
    kept = 0
    for p in candidates:
        if protect is not None and p == protect or is_held(p):
            kept += 1
            continue
        if kept < keep:
            kept += 1
            continue
        discard(p)
        removed.append(p)
    return removed
