"""What a downloaded file must be: sizes and hashes recorded when a download was verified.

The download module (:mod:`dora_primespeech_mlx.assets.download`) checks every file it fetches against the size
and SHA-256 the Hugging Face Hub gives for it (the git blob SHA-1 for small non-LFS files), at a pinned
revision, and records the result in ``<originals>/.primespeech-download.json``:

    {"repos": {"<repo>": {"revision": "<commit>", "files": {"<path>": {"size", "sha256", "blob_id",
                                                                     "mtime_ns"}}}}}

That record pins the revision of later downloads from the same repo, lets a later check work offline,
and lets :func:`damaged` tell (by size, without hashing) that a recorded file was truncated or replaced,
so that such a voice counts as not installed and is fetched again. Only the standard library is used.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

LOCK_NAME = ".primespeech-download.json"
_CHUNK = 1 << 20


def lock_path(originals: Path) -> Path:
    return Path(originals) / LOCK_NAME


def read_lock(originals: Path) -> dict:
    try:
        data = json.loads(lock_path(originals).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"repos": {}}
    if not isinstance(data, dict) or not isinstance(data.get("repos"), dict):
        return {"repos": {}}
    return data


def write_lock(originals: Path, data: dict) -> None:
    """Write the record atomically (a temporary file renamed over the old one)."""
    originals = Path(originals)
    originals.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f"{LOCK_NAME}.", dir=originals)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, lock_path(originals))
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def file_entry(lock: dict, repo: str, filename: str) -> dict | None:
    entry = lock.get("repos", {}).get(repo, {}).get("files", {}).get(filename)
    return entry if isinstance(entry, dict) else None


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def git_blob_sha1(path: Path) -> str:
    """The git object id of a file (what the Hub reports as ``blob_id`` of a non-LFS file)."""
    h = hashlib.sha1()
    h.update(b"blob %d\0" % Path(path).stat().st_size)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def mismatch(path: Path, size: int | None, sha256: str | None, blob_id: str | None) -> str | None:
    """Why ``path`` is not the expected file (None when it is): size first, then the content hash."""
    path = Path(path)
    if not path.is_file():
        return "missing"
    actual = path.stat().st_size
    if size is not None and actual != size:
        return f"size {actual} bytes, expected {size}"
    if sha256:
        got = sha256_of(path)
        if got != sha256.lower():
            return f"SHA-256 {got}, expected {sha256.lower()}"
    elif blob_id:
        got = git_blob_sha1(path)
        if got != blob_id.lower():
            return f"git blob id {got}, expected {blob_id.lower()}"
    return None


def damaged(originals: Path, paths) -> list[Path]:
    """The recorded files among ``paths`` (files, or folders whose files are recorded) whose size no
    longer matches the record: truncated or replaced since they were verified. Cheap (``stat`` only)."""
    originals = Path(originals)
    lock = read_lock(originals)
    recorded: dict[Path, int] = {}
    for repo in lock.get("repos", {}).values():
        for name, entry in (repo.get("files") or {}).items():
            if isinstance(entry, dict) and isinstance(entry.get("size"), int):
                recorded[originals / name] = entry["size"]
    out = []
    for p in paths:
        p = Path(p)
        candidates = [q for q in recorded if q == p or p in q.parents]
        for q in candidates:
            try:
                ok = q.stat().st_size == recorded[q]
            except OSError:
                ok = False
            if not ok:
                out.append(q)
    return out
