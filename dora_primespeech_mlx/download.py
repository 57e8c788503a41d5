"""Downloads from Hugging Face: preset voices (``MoYoYoTech/tone-models``) and the shared encoders
(``lj1995/GPT-SoVITS``), into the old dora-primespeech layout under the model directory.

``huggingface_hub`` writes each file to a temporary ``.incomplete`` file and renames it when complete,
so an interrupted download leaves nothing half-written and is resumed by the next call. Nothing is ever
replaced by placeholder files: a failure raises :class:`DownloadError` that says what to do.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from .errors import DownloadError
from .paths import model_dir, originals_dir
from .voices import VoiceSpec, encoder_info, preset_voice

log = logging.getLogger(__name__)


_HUB_REACHABLE: bool | None = None


def _check_hub(dest_root: Path, filename: str) -> None:
    """Fail in seconds, not after minutes of retries, when the Hub cannot be reached at all."""
    global _HUB_REACHABLE
    if _HUB_REACHABLE is None:
        if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes"}:
            _HUB_REACHABLE = False
        else:
            endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
            url = urlparse(endpoint)
            port = url.port or (443 if url.scheme == "https" else 80)
            try:
                socket.create_connection((url.hostname, port), timeout=5).close()
                _HUB_REACHABLE = True
            except OSError:
                _HUB_REACHABLE = False
    if not _HUB_REACHABLE:
        raise DownloadError(
            f"cannot reach the Hugging Face Hub (offline, or HF_HUB_OFFLINE=1) to download {filename}.\n"
            f"Place the voice files by hand under {dest_root.parent} (the old dora-primespeech node's layout: "
            "moyoyo/GPT_weights, moyoyo/SoVITS_weights, moyoyo/ref_audios, moyoyo/chinese-hubert-base, "
            "moyoyo/chinese-roberta-wwm-ext-large), or set PRIMESPEECH_MODEL_DIR to a folder that has them, "
            "or run `primespeech-mlx download VOICE` on a machine with internet access and copy the folder."
        )


def _fetch(repo: str, filename: str, dest_root: Path) -> Path:
    target = dest_root / filename
    if target.is_file() and target.stat().st_size > 0:
        return target
    _check_hub(dest_root, filename)
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise DownloadError("huggingface_hub is not installed") from exc
    dest_root.mkdir(parents=True, exist_ok=True)
    log.info("downloading %s from %s", filename, repo)
    try:
        return Path(hf_hub_download(repo_id=repo, filename=filename, local_dir=str(dest_root)))
    except Exception as exc:  # offline, 404, HTTP errors, disk errors
        raise DownloadError(
            f"could not download '{filename}' from the Hugging Face repo '{repo}': "
            f"{type(exc).__name__}: {exc}\n"
            f"Check the network connection (or HF_ENDPOINT / HF_HUB_OFFLINE), or place the file by hand at "
            f"{target} (the old dora-primespeech node's layout), or set PRIMESPEECH_MODEL_DIR to a folder "
            "that has it."
        ) from None


def download_encoders(root: Path | None = None) -> tuple[Path, Path]:
    """Download CNHubert and Chinese RoBERTa (once, shared by all voices)."""
    root = root or model_dir()
    enc = encoder_info()
    dest = originals_dir(root)
    for f in enc.hubert_files:
        _fetch(enc.repository, f"{enc.hubert}/{f}", dest)
    for f in enc.bert_files:
        _fetch(enc.repository, f"{enc.bert}/{f}", dest)
    return dest / enc.hubert, dest / enc.bert


def download_sv(root: Path | None = None) -> Path:
    """Download the speaker-verification model (ERes2NetV2) that v2Pro / v2ProPlus voices need (once)."""
    root = root or model_dir()
    enc = encoder_info()
    return _fetch(enc.repository, enc.sv, originals_dir(root))


def download_voice(name: str, root: Path | None = None, convert: bool = True) -> VoiceSpec:
    """Download a preset voice and the shared encoders, then convert them to the MLX format once."""
    root = root or model_dir()
    spec = preset_voice(name, root)
    download_encoders(root)
    for f in spec.files:
        _fetch(spec.repository, f, originals_dir(root))
    if spec.needs_sv:  # a v2Pro / v2ProPlus SoVITS: the speaker-verification model too
        download_sv(root)
    if convert:
        from .convert.load import convert_voice

        convert_voice(spec, root)
        from .encoders import coreml_available

        if coreml_available():  # macOS: build the Neural Engine encoders once, now rather than at first use
            from .coreml.export import export_voice_encoders

            try:
                export_voice_encoders(spec, root)
            except Exception as exc:  # the MLX encoders still work; the engine retries or falls back
                log.warning("CoreML export failed (%s); the MLX encoders will be used", exc)
    return spec
