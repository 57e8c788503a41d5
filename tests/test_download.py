"""Voice installation: resumable, verified Hub downloads (mocked: no network here), conversion, clear
offline errors, and no half-written file used after an interruption."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from dora_primespeech_mlx.assets import download
from dora_primespeech_mlx.assets.catalog import encoder_info, preset_voice, resolve_voice
from dora_primespeech_mlx.assets.integrity import git_blob_sha1, read_lock
from dora_primespeech_mlx.convert.load import convert, is_converted, load
from dora_primespeech_mlx.errors import DownloadError, VoiceNotInstalledError
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


LFS_MIN = 10_000  # files this large are "LFS" files on the fake Hub (SHA-256); smaller ones get a git blob id


class FakeHub:
    """Serves the fixture files as the Hub would: ``hf_hub_download`` plus the metadata calls of ``HfApi``
    (``model_info(...).sha``, ``get_paths_info`` with size and LFS SHA-256 / git blob id), at a commit."""

    def __init__(self, commit: str = "a" * 40):
        self.commit = commit
        self.calls: list[tuple[str, str]] = []
        self.revisions: list[str | None] = []
        self.corrupt: set[str] = set()  # filenames served with one flipped byte (same size)

    def hf_hub_download(self, repo_id, filename, *, local_dir, revision=None, **kw):
        self.calls.append((repo_id, filename))
        self.revisions.append(revision)
        target = Path(local_dir) / filename
        target.parent.mkdir(parents=True, exist_ok=True)
        data = bytearray(_fixture_source(filename).read_bytes())
        if filename in self.corrupt:
            data[len(data) // 2] ^= 0xFF
        target.write_bytes(bytes(data))
        return str(target)

    def model_info(self, repo_id, **kw):
        return SimpleNamespace(sha=self.commit)

    def get_paths_info(self, repo_id, paths, revision=None, **kw):
        out = []
        for p in paths:
            src = _fixture_source(p)
            size = src.stat().st_size
            lfs = {"size": size, "sha256": hashlib.sha256(src.read_bytes()).hexdigest()} if size >= LFS_MIN else None
            out.append(SimpleNamespace(path=p, size=size, blob_id=git_blob_sha1(src), lfs=lfs))
        return out

    def install(self, monkeypatch):
        import huggingface_hub

        monkeypatch.setattr(huggingface_hub, "hf_hub_download", self.hf_hub_download)
        monkeypatch.setattr(download, "_api", lambda: self)
        monkeypatch.setattr(download, "_HUB_REACHABLE", True)
        return self


def test_download_installs_and_converts_a_preset(tmp_path, monkeypatch):
    import huggingface_hub

    hub = FakeHub().install(monkeypatch)
    assert huggingface_hub.hf_hub_download == hub.hf_hub_download
    calls = hub.calls
    with pytest.raises(VoiceNotInstalledError, match="primespeech-mlx download"):
        resolve_voice("Doubao", tmp_path)
    spec = download.download_voice("Doubao", tmp_path)
    assert resolve_voice("Doubao", tmp_path).installed
    repos = {r for r, _ in calls}
    assert repos == {"MoYoYoTech/tone-models", "lj1995/GPT-SoVITS"}
    assert {f for r, f in calls if r == "MoYoYoTech/tone-models"} == set(spec.files)
    converted = sorted((tmp_path / "mlx").iterdir())
    assert len(converted) == 4 and all(is_converted(p) for p in converted)
    # every file verified and recorded, with the revision it came from
    lock = read_lock(tmp_path / "moyoyo")
    for repo, name in calls:
        entry = lock["repos"][repo]["files"][name]
        assert entry["size"] == (tmp_path / "moyoyo" / name).stat().st_size
        assert entry["revision"] == hub.commit and (entry["sha256"] or entry["blob_id"])
    # A second call downloads nothing (files present and verified) and converts nothing new.
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

    def broken(repo_id, filename, local_dir, **kw):
        raise ConnectionError("connection reset")

    FakeHub().install(monkeypatch)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", broken)
    with pytest.raises(DownloadError) as exc:
        download.download_voice("Cove", tmp_path)
    assert "lj1995/GPT-SoVITS" in str(exc.value) and "connection reset" in str(exc.value)
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


def test_every_preset_resolves_to_the_old_layout(tmp_path):
    spec = preset_voice("Luo Xiang", tmp_path)
    assert spec.gpt == tmp_path / "moyoyo" / "GPT_weights" / "luoxiang_best_gpt.ckpt"
    assert spec.hubert == tmp_path / "moyoyo" / "chinese-hubert-base"
    assert spec.speed_factor == 1.1 and spec.language == "zh"


def _truncate(path: Path) -> bytes:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # what an interrupted copy leaves
    return data


def test_truncated_download_counts_as_missing_and_is_fetched_again(tmp_path, monkeypatch):
    hub = FakeHub().install(monkeypatch)
    spec = download.download_voice("Doubao", tmp_path, convert=False)
    original = _truncate(spec.gpt)
    # the node's start sees a damaged voice as not installed (and so downloads it when allowed)
    with pytest.raises(VoiceNotInstalledError):
        resolve_voice("Doubao", tmp_path)
    hub.calls.clear()
    download.download_voice("Doubao", tmp_path, convert=False)
    assert hub.calls == [("MoYoYoTech/tone-models", spec.files[0])]  # only the damaged file
    assert spec.gpt.read_bytes() == original
    assert resolve_voice("Doubao", tmp_path).installed


def test_same_size_corruption_is_found_by_the_hash(tmp_path, monkeypatch):
    hub = FakeHub().install(monkeypatch)
    spec = download.download_voice("Doubao", tmp_path, convert=False)
    data = bytearray(spec.sovits.read_bytes())
    data[100] ^= 0xFF
    spec.sovits.write_bytes(bytes(data))  # same size, new mtime: re-hashed
    hub.calls.clear()
    download.download_voice("Doubao", tmp_path, convert=False)
    assert hub.calls == [("MoYoYoTech/tone-models", spec.files[1])]
    assert hashlib.sha256(spec.sovits.read_bytes()).hexdigest() == \
        read_lock(tmp_path / "moyoyo")["repos"]["MoYoYoTech/tone-models"]["files"][spec.files[1]]["sha256"]


def test_unrecorded_file_is_checked_against_the_hub(tmp_path, monkeypatch):
    """A file placed by hand (or left by an interrupted copy) before any download: checked against the
    Hub's size/SHA-256, used when it matches, fetched again when it does not."""
    hub = FakeHub().install(monkeypatch)
    spec = preset_voice("Doubao", tmp_path)
    good, bad = spec.sovits, spec.gpt
    for f, name in ((good, spec.files[1]), (bad, spec.files[0])):
        f.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(_fixture_source(name), f)
    original = _truncate(bad)
    download.download_voice("Doubao", tmp_path, convert=False)
    tone = [f for r, f in hub.calls if r == "MoYoYoTech/tone-models"]
    assert spec.files[0] in tone and spec.files[1] not in tone
    assert bad.read_bytes() == original


def test_checksum_mismatch_is_rejected_with_a_clear_error(tmp_path, monkeypatch):
    hub = FakeHub().install(monkeypatch)
    spec = preset_voice("Doubao", tmp_path)
    hub.corrupt.add(spec.files[0])
    with pytest.raises(DownloadError) as exc:
        download.download_voice("Doubao", tmp_path, convert=False)
    msg = str(exc.value)
    assert spec.files[0] in msg and "does not match the Hub's checksum" in msg and "SHA-256" in msg
    assert not spec.gpt.exists()  # removed, never left for a later start
    lock = read_lock(tmp_path / "moyoyo")
    assert spec.files[0] not in lock["repos"].get("MoYoYoTech/tone-models", {}).get("files", {})


def test_small_files_are_checked_by_git_blob_id(tmp_path, monkeypatch):
    hub = FakeHub().install(monkeypatch)
    enc = encoder_info()
    small = [f for f in enc.hubert_files if _fixture_source(f"{enc.hubert}/{f}").stat().st_size < LFS_MIN]
    if not small:
        pytest.skip("the fixture encoders have no small (non-LFS) file")
    name = f"{enc.hubert}/{small[0]}"
    hub.corrupt.add(name)
    with pytest.raises(DownloadError, match="git blob id"):
        download.download_encoders(tmp_path)


def test_revisions_are_pinned(tmp_path, monkeypatch):
    hub = FakeHub(commit="1" * 40).install(monkeypatch)
    download.download_encoders(tmp_path)
    assert set(hub.revisions) == {"1" * 40}
    # the Hub's main moves on: later downloads from that repo keep the recorded commit
    hub.commit = "2" * 40
    hub.revisions.clear()
    download.download_voice("Doubao", tmp_path, convert=False)
    lock = read_lock(tmp_path / "moyoyo")
    assert lock["repos"]["lj1995/GPT-SoVITS"]["revision"] == "1" * 40
    assert lock["repos"]["MoYoYoTech/tone-models"]["revision"] == "2" * 40  # first download from that repo
    assert set(hub.revisions) == {"2" * 40}
    # a revision in the catalog wins over both
    pinned = "3" * 40
    monkeypatch.setattr(download, "preset_voice",
                        lambda name, root: __import__("dataclasses").replace(preset_voice(name, root), revision=pinned))
    hub.revisions.clear()
    download.download_voice("Maple", tmp_path, convert=False)
    assert pinned in hub.revisions


def test_offline_verified_files_are_used_and_damaged_ones_fail(tmp_path, monkeypatch):
    FakeHub().install(monkeypatch)
    spec = download.download_voice("Doubao", tmp_path, convert=False)
    monkeypatch.setattr(download, "_HUB_REACHABLE", False)
    download.download_voice("Doubao", tmp_path, convert=False)  # all recorded and intact: no Hub needed
    _truncate(spec.reference)
    with pytest.raises(DownloadError, match="cannot reach the Hugging Face Hub"):
        download.download_voice("Doubao", tmp_path, convert=False)


KILL_DURING_CONVERSION = textwrap.dedent("""
    import sys, time
    import safetensors.numpy
    from dora_primespeech_mlx.convert import load as conv

    real = safetensors.numpy.save_file

    def slow_save(tensors, path, *a, **k):
        real(tensors, path, *a, **k)
        with open(path, "r+b") as f:  # a half-written weight file, as when killed mid-write
            f.truncate(max(1, f.seek(0, 2) // 2))
        open(sys.argv[3], "w").close()  # tell the parent: now
        time.sleep(600)

    safetensors.numpy.save_file = slow_save
    conv.convert(sys.argv[1], sys.argv[2])
""")


def test_kill_during_conversion_leaves_nothing_a_later_start_uses(tmp_path):
    ckpt = load_cases_json().get("checkpoints") or {}
    src = require_fixture(Path("models") / ckpt["gpt"])
    dst = tmp_path / "mlx" / "gpt-converted"
    flag = tmp_path / "writing"
    script = tmp_path / "convert_then_hang.py"
    script.write_text(KILL_DURING_CONVERSION, encoding="utf-8")
    proc = subprocess.Popen([sys.executable, str(script), str(src), str(dst), str(flag)],
                            cwd=Path(__file__).resolve().parents[1])
    try:
        deadline = time.monotonic() + 120
        while not flag.exists():
            assert proc.poll() is None, "the converter exited before it was killed"
            assert time.monotonic() < deadline, "the converter never reached the write"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    # the half-written weights sit in a temporary folder, never at the destination
    assert not dst.exists() and not is_converted(dst)
    partial = [p for p in dst.parent.iterdir() if p.name.startswith(f".{dst.name}.")]
    assert partial and (partial[0] / "model.safetensors").is_file()
    # a later conversion produces a complete model
    convert(src, dst)
    assert is_converted(dst)
    assert json.loads((dst / "config.json").read_text(encoding="utf-8"))["kind"] == "gpt"
    assert load(dst) is not None
