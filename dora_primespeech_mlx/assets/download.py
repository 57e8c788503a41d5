"""Downloads from Hugging Face: preset voices (``MoYoYoTech/tone-models``) and the shared encoders
(``lj1995/GPT-SoVITS``), into the old dora-primespeech layout under the model directory.

``huggingface_hub`` writes each file to a temporary ``.incomplete`` file and renames it when complete,
so an interrupted download (even ``kill -9``) leaves nothing half-written and is resumed by the next call.
Every file is checked against the size and SHA-256 the Hub gives for it (git blob id for small non-LFS
files) at a pinned revision: the catalog's ``revision`` of the repo, else the commit the first download
from that repo resolved, recorded with the verified sizes and hashes in
``<originals>/.primespeech-download.json`` (:mod:`dora_primespeech_mlx.assets.integrity`). A present file that does
not match (truncated by an interrupted copy, corrupt) is fetched again; a download that does not match is
removed and raises. Conversion writes to a temporary folder renamed into place
(:func:`dora_primespeech_mlx.convert.load.convert`). Nothing is ever replaced by placeholder files: a
failure raises :class:`DownloadError` that says what to do.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

from huggingface_hub import constants as hf_constants

from ..convert.load import convert_voice
from ..errors import DownloadError
from ..paths import originals_dir
from .catalog import VoiceSpec, encoder_info, not_installed_message, preset_voice
from .integrity import file_entry, mismatch, read_lock, write_lock

log = logging.getLogger(__name__)


_HUB_REACHABLE: bool | None = None


def _hub_reachable() -> bool:
    global _HUB_REACHABLE
    if _HUB_REACHABLE is None:
        if hf_constants.HF_HUB_OFFLINE:  # huggingface_hub's own settings (HF_HUB_OFFLINE, HF_ENDPOINT)
            _HUB_REACHABLE = False
        else:
            endpoint = hf_constants.ENDPOINT
            url = urlparse(endpoint)
            port = url.port or (443 if url.scheme == "https" else 80)
            try:
                socket.create_connection((url.hostname, port), timeout=5).close()
                _HUB_REACHABLE = True
            except OSError:
                _HUB_REACHABLE = False
    return _HUB_REACHABLE


OFFLINE = "cannot reach the Hugging Face Hub (offline, or HF_HUB_OFFLINE=1)"


def _offline_error(what: str, missing: list[Path], dest_root: Path) -> DownloadError:
    """The offline answer: the exact files that are missing and where they go."""
    listing = "\n  ".join(str(p) for p in missing)
    return DownloadError(
        f"{OFFLINE} to download {what}; missing:\n  {listing}\n"
        f"Place these files by hand (the old dora-primespeech node's layout under {dest_root.parent}), or set "
        "PRIMESPEECH_MODEL_DIR to a folder that has them, or run `primespeech-mlx download` on a machine with "
        "internet access and copy the folder."
    )


def _check_hub(dest_root: Path, filename: str) -> None:
    """Fail in seconds, not after minutes of retries, when the Hub cannot be reached at all."""
    if not _hub_reachable():
        raise _offline_error(filename, [dest_root / filename], dest_root)


def _check_offline(what: str, dest_root: Path, repo_files: list[str]) -> None:
    """Offline, name every missing file of ``what`` at once (not only the first one a download would meet)."""
    if _hub_reachable():
        return
    missing = [dest_root / f for f in repo_files if not (dest_root / f).is_file()]
    if missing:
        raise _offline_error(what, missing, dest_root)


def _api():
    from huggingface_hub import HfApi

    return HfApi()


def _revision(repo: str, pinned: str | None, lock: dict) -> str:
    """The commit to download ``repo`` at: the catalog's pin, else the one recorded by the first download
    from that repo, else the repo's current commit (then recorded, so later files come from the same one)."""
    if pinned:
        return pinned
    recorded = lock.get("repos", {}).get(repo, {}).get("revision")
    if recorded:
        return recorded
    try:
        sha = _api().model_info(repo).sha
    except Exception as exc:
        raise DownloadError(f"cannot resolve the current revision of the Hugging Face repo '{repo}': "
                            f"{type(exc).__name__}: {exc}") from None
    if not sha:
        raise DownloadError(f"the Hugging Face Hub gave no commit for '{repo}'")
    return str(sha)


def _remote(repo: str, filename: str, revision: str) -> dict:
    """Size and SHA-256 (LFS files) or git blob id (small files) of ``filename`` at ``revision``."""
    try:
        infos = _api().get_paths_info(repo, [filename], revision=revision)
    except Exception as exc:
        raise DownloadError(f"cannot read the size/SHA-256 of '{filename}' in the Hugging Face repo '{repo}' "
                            f"(revision {revision}): {type(exc).__name__}: {exc}") from None
    for info in infos:
        if getattr(info, "path", None) == filename and getattr(info, "size", None) is not None:
            lfs = getattr(info, "lfs", None)
            sha256 = (lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", None)) if lfs else None
            return {"size": int(info.size), "sha256": sha256, "blob_id": None if sha256 else info.blob_id}
    raise DownloadError(f"'{filename}' is not a file of the Hugging Face repo '{repo}' at revision {revision}")


def _record(dest_root: Path, repo: str, revision: str, filename: str, expected: dict) -> None:
    lock = read_lock(dest_root)
    entry = lock["repos"].setdefault(repo, {"revision": revision, "files": {}})
    entry.setdefault("revision", revision)
    entry.setdefault("files", {})[filename] = {**expected, "revision": revision,
                                               "mtime_ns": (dest_root / filename).stat().st_mtime_ns}
    write_lock(dest_root, lock)


def _local_ok(target: Path, entry: dict) -> str | None:
    """Why a recorded file no longer matches its record (None: it does). Hashes only a file whose size or
    modification time changed since it was verified."""
    st = target.stat()
    if st.st_size == entry.get("size") and st.st_mtime_ns == entry.get("mtime_ns"):
        return None
    return mismatch(target, entry.get("size"), entry.get("sha256"), entry.get("blob_id"))


def _fetch(repo: str, filename: str, dest_root: Path, revision: str | None = None) -> Path:
    """``dest_root/filename``, downloaded from ``repo`` unless a verified copy is there.

    A file already present is used only if it matches the record of an earlier verified download (or,
    never verified, the Hub's size and SHA-256); a truncated or corrupt one is removed and fetched again.
    Offline, a file placed by hand (no record) is used as it is. A download that does not match the Hub's
    checksum is removed and raises :class:`DownloadError`.
    """
    target = dest_root / filename
    lock = read_lock(dest_root)
    entry = file_entry(lock, repo, filename)
    if target.is_file():
        if entry is not None:
            why = _local_ok(target, entry)
            if why is None:
                if target.stat().st_mtime_ns != entry.get("mtime_ns"):  # same content, touched: re-record
                    _record(dest_root, repo, entry.get("revision") or _revision(repo, revision, lock), filename,
                            {k: entry.get(k) for k in ("size", "sha256", "blob_id")})
                return target
        elif not _hub_reachable():
            log.info("%s: not downloaded by this package (no record), cannot be checked offline: used as is",
                     target)
            return target
        else:
            rev = _revision(repo, revision, lock)
            expected = _remote(repo, filename, rev)
            why = mismatch(target, expected["size"], expected["sha256"], expected["blob_id"])
            if why is None:
                _record(dest_root, repo, rev, filename, expected)
                return target
        log.warning("%s is damaged (%s): downloading it again", target, why)
        target.unlink()
    _check_hub(dest_root, filename)
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise DownloadError("huggingface_hub is not installed") from exc
    rev = _revision(repo, revision, lock)
    expected = _remote(repo, filename, rev)
    dest_root.mkdir(parents=True, exist_ok=True)
    log.info("downloading %s from %s (revision %s, %d bytes)", filename, repo, rev, expected["size"])
    try:
        # huggingface_hub writes to a temporary file and renames it when complete (no half-written target)
        path = Path(hf_hub_download(repo_id=repo, filename=filename, revision=rev, local_dir=str(dest_root)))
    except Exception as exc:  # offline, 404, HTTP errors, disk errors
        raise DownloadError(
            f"could not download '{filename}' from the Hugging Face repo '{repo}': "
            f"{type(exc).__name__}: {exc}\n"
            f"Check the network connection (or HF_ENDPOINT / HF_HUB_OFFLINE), or place the file by hand at "
            f"{target} (the old dora-primespeech node's layout), or set PRIMESPEECH_MODEL_DIR to a folder "
            "that has it."
        ) from None
    why = mismatch(path, expected["size"], expected["sha256"], expected["blob_id"])
    if why is not None:
        path.unlink(missing_ok=True)
        raise DownloadError(
            f"the downloaded '{filename}' from '{repo}' (revision {rev}) does not match the Hub's checksum "
            f"({why}); it was removed. Run the download again; if it keeps failing, the transfer is being "
            "altered (proxy, disk) or the Hub's copy changed."
        )
    _record(dest_root, repo, rev, filename, expected)
    return path


def download_encoders(root: Path) -> tuple[Path, Path]:
    """Download CNHubert and Chinese RoBERTa (once, shared by all voices) into the model directory ``root``."""
    enc = encoder_info()
    dest = originals_dir(root)
    _check_offline("the shared encoders", dest, [f"{enc.hubert}/{f}" for f in enc.hubert_files]
                   + [f"{enc.bert}/{f}" for f in enc.bert_files])
    for f in enc.hubert_files:
        _fetch(enc.repository, f"{enc.hubert}/{f}", dest, enc.revision)
    for f in enc.bert_files:
        _fetch(enc.repository, f"{enc.bert}/{f}", dest, enc.revision)
    return dest / enc.hubert, dest / enc.bert


def download_sv(root: Path) -> Path:
    """Download the speaker-verification model (ERes2NetV2) that v2Pro / v2ProPlus voices need (once) into the
    model directory ``root``."""
    enc = encoder_info()
    return _fetch(enc.repository, enc.sv, originals_dir(root))


def download_voice(name: str, root: Path, convert: bool = True,
                   after_convert: Callable[[VoiceSpec, Path], None] | None = None) -> VoiceSpec:
    """Download a preset voice and the shared encoders, then convert them to the MLX format once.

    ``after_convert(spec, root)`` runs once the conversion is done: the caller's preparation of what sits above
    this layer (the CLI and the node pass ``engine.encoders.prepare_coreml``: the CoreML encoders on macOS)."""
    spec = preset_voice(name, root)
    if not _hub_reachable():  # offline: the same exact-missing-files message as a start without downloads
        missing = spec.missing_files()
        if missing:
            raise DownloadError(f"{OFFLINE} to download voice {spec.name!r}: "
                                + not_installed_message(spec, missing, root, offline=True))
    download_encoders(root)
    for f in spec.files:
        _fetch(spec.repository, f, originals_dir(root), spec.revision)
    if spec.needs_sv:  # a v2Pro / v2ProPlus SoVITS: the speaker-verification model too
        download_sv(root)
    if convert:
        convert_voice(spec, root)
        if after_convert is not None:
            after_convert(spec, root)
    return spec
