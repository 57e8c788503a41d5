"""Voice installation: resumable Hub downloads (mocked: no network here), conversion, clear offline errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dora_primespeech_mlx import download
from dora_primespeech_mlx.convert.load import is_converted
from dora_primespeech_mlx.errors import DownloadError, VoiceNotInstalledError
from dora_primespeech_mlx.voices import encoder_info, preset_voice, resolve_voice
from tests.conftest import load_cases_json, require_fixture


@pytest.fixture(autouse=True)
def _reset_hub_state(monkeypatch):
    monkeypatch.setattr(download, "_HUB_REACHABLE", None)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


def _fixture_source(filename: str) -> Path:
    """Which fixture file stands in for a file of the real repos."""
    ckpt = load_cases_json().get("checkpoints") or {}
    require_fixture("models/cases.json")
    enc = encoder_info()
    models = require_fixture("models")
    if filename.startswith(enc.hubert + "/"):
        return models / ckpt["hubert"] / filename.split("/", 1)[1]
    if filename.startswith(enc.bert + "/"):
        return models / ckpt["bert"] / filename.split("/", 1)[1]
    if filename.endswith(".ckpt"):
        return models / ckpt["gpt"]
    if filename.endswith(".pth"):
        return models / ckpt["sovits"]
    return models / "ref_audio" / "e2e_ref_32k.wav"


def _fake_hub(calls: list):
    def hf_hub_download(repo_id, filename, local_dir):
        calls.append((repo_id, filename))
        target = Path(local_dir) / filename
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(_fixture_source(filename), target)
        return str(target)

    return hf_hub_download


def test_download_installs_and_converts_a_preset(tmp_path, monkeypatch):
    import huggingface_hub

    calls: list = []
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", _fake_hub(calls))
    monkeypatch.setattr(download, "_HUB_REACHABLE", True)
    with pytest.raises(VoiceNotInstalledError, match="primespeech-mlx download"):
        resolve_voice("Doubao", tmp_path)
    spec = download.download_voice("Doubao", tmp_path)
    assert resolve_voice("Doubao", tmp_path).installed
    repos = {r for r, _ in calls}
    assert repos == {"MoYoYoTech/tone-models", "lj1995/GPT-SoVITS"}
    assert {f for r, f in calls if r == "MoYoYoTech/tone-models"} == set(spec.files)
    converted = sorted((tmp_path / "mlx").iterdir())
    assert len(converted) == 4 and all(is_converted(p) for p in converted)
    # A second call downloads nothing (files present) and converts nothing new.
    calls.clear()
    download.download_voice("Doubao", tmp_path)
    assert calls == []
    assert sorted((tmp_path / "mlx").iterdir()) == converted


def test_offline_fails_fast_and_writes_nothing(tmp_path, monkeypatch):
    import socket

    def refuse(*a, **k):
        raise OSError("network unreachable")

    monkeypatch.setattr(socket, "create_connection", refuse)
    with pytest.raises(DownloadError) as exc:
        download.download_voice("Maple", tmp_path)
    msg = str(exc.value)
    assert "cannot reach the Hugging Face Hub" in msg and str(tmp_path) in msg and "PRIMESPEECH_MODEL_DIR" in msg
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


def test_hf_hub_offline_is_respected(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DownloadError, match="offline"):
        download.download_encoders(tmp_path)


def test_failed_transfer_names_the_file(tmp_path, monkeypatch):
    import huggingface_hub

    def broken(repo_id, filename, local_dir):
        raise ConnectionError("connection reset")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", broken)
    monkeypatch.setattr(download, "_HUB_REACHABLE", True)
    with pytest.raises(DownloadError) as exc:
        download.download_voice("Cove", tmp_path)
    assert "lj1995/GPT-SoVITS" in str(exc.value) and "connection reset" in str(exc.value)
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


def test_every_preset_resolves_to_the_old_layout(tmp_path):
    spec = preset_voice("Luo Xiang", tmp_path)
    assert spec.gpt == tmp_path / "moyoyo" / "GPT_weights" / "luoxiang_best_gpt.ckpt"
    assert spec.hubert == tmp_path / "moyoyo" / "chinese-hubert-base"
    assert spec.speed_factor == 1.1 and spec.language == "zh"
