"""Faults with the real engine and the fixture models: broken weight files and reference clips at start and at
``change_voice`` (a clear error; the previous voice stays and keeps serving), a voice folder deleted while
running, and the bounded cache of per-request voices."""

from __future__ import annotations

import json
import shutil
import threading

import numpy as np
import pyarrow as pa
import pytest
import soundfile as sf
import yaml
from conftest import full_run, text_data_env
from tiny_voice import VOICE, checkpoint, make_model_dir, reference_wav, write_voice

from dora_primespeech_mlx.dataflow.handler import MessageHandler
from dora_primespeech_mlx.dataflow.transport import DirectTransport
from dora_primespeech_mlx.node import engine_factory, start_failure
from dora_primespeech_mlx.settings import Settings

TEXT = "Hello world, this is a small test."


class Recorder:
    def __init__(self):
        self.sent = []
        self.lock = threading.Lock()

    def __call__(self, output, array, metadata):
        with self.lock:
            self.sent.append((output, array, dict(metadata)))

    def statuses(self):
        return [json.loads(a[0].as_py()) for o, a, _ in self.sent if o == "status"]

    def completes(self):
        return [(a.to_pylist()[0], m) for o, a, m in self.sent if o == "segment_complete"]


def _settings(model_dir, voice=VOICE, **env):
    return Settings.from_env({"VOICE_NAME": voice, "PRIMESPEECH_MODEL_DIR": str(model_dir), "GPTSVITS_WARMUP": "false",
                              "TOP_K": "1", **text_data_env(), **env})


def _handler(model_dir, voice=VOICE, **env):
    settings = _settings(model_dir, voice, **env)
    rec = Recorder()
    handler = MessageHandler(settings, engine_factory(settings), DirectTransport(rec))
    handler.start()
    assert handler.ready.wait(300)
    return handler, rec


def _variant(model_dir, name, **files):
    """A user voice like the tiny one with some files replaced."""
    path = write_voice(model_dir, name)
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data.update({k: str(v) for k, v in files.items()})
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return name


def _bad_files(tmp) -> dict[str, dict]:
    """name -> replaced files, one per fault."""
    tmp.mkdir(parents=True, exist_ok=True)
    wav, sr = sf.read(str(reference_wav()), dtype="float32")
    truncated = tmp / "truncated.ckpt"
    truncated.write_bytes(checkpoint("sovits").read_bytes()[:5000])
    garbage = tmp / "garbage.pth"
    garbage.write_bytes(b"this is not a checkpoint" * 100)
    not_wav = tmp / "not.wav"
    not_wav.write_text("RIFF? no.")
    short = tmp / "short.wav"
    sf.write(str(short), wav[: sr // 2], sr)
    long = tmp / "long.wav"
    sf.write(str(long), np.tile(wav, int(np.ceil(60 * sr / len(wav))))[: 60 * sr], sr)
    nan = tmp / "nan.wav"
    bad = wav.copy()
    bad[100:200] = np.nan
    sf.write(str(nan), bad, sr, subtype="FLOAT")
    return {
        "TruncSovits": {"sovits": truncated}, "GarbageGpt": {"gpt": garbage}, "MissingGpt": {"gpt": tmp / "nope.ckpt"},
        "NotWav": {"reference": not_wav}, "Short": {"reference": short}, "Long": {"reference": long},
        "NaN": {"reference": nan},
    }


@pytest.fixture(scope="module")
def faulty_dir(tmp_path_factory):
    root = make_model_dir(tmp_path_factory.mktemp("faults"))
    tmp = root / "bad"
    for name, files in _bad_files(tmp).items():
        _variant(root, name, **files)
    wav, sr = sf.read(str(reference_wav()), dtype="float32")
    stereo, low = tmp / "stereo.wav", tmp / "8k.wav"
    sf.write(str(stereo), np.stack([wav, wav], axis=1), sr)
    import soxr

    sf.write(str(low), soxr.resample(wav, sr, 8000), 8000)
    _variant(root, "Stereo", reference=stereo)
    _variant(root, "EightK", reference=low)
    return root


FAULTS = ["TruncSovits", "GarbageGpt", "MissingGpt", "NotWav", "Short", "Long", "NaN"]


@pytest.mark.parametrize("voice", FAULTS)
def test_a_broken_start_voice_fails_clearly(faulty_dir, voice):
    settings = _settings(faulty_dir, voice, PRIMESPEECH_AUTO_DOWNLOAD="false")
    handler = MessageHandler(settings, engine_factory(settings), DirectTransport(Recorder()))
    handler.start()
    assert handler.ready.wait(300)
    message = start_failure(handler)
    assert message is not None and message.startswith("cannot start:")
    print(f"{voice}: {message[:200]}")
    assert "Traceback" not in message and len(message) < 2000


def test_change_voice_to_broken_voices_keeps_the_current_one(faulty_dir):
    handler, rec = _handler(faulty_dir)
    for i, voice in enumerate(FAULTS):
        handler.on_input("control", pa.array([f"change_voice:{voice}"]), {"i": i})
        handler.on_input("text", pa.array([TEXT]), {"t": i})
    for voice in ("Stereo", "EightK"):  # usable clips: mixed down / resampled like the original
        handler.on_input("control", pa.array([f"change_voice:{voice}"]), {})
        handler.on_input("text", pa.array([TEXT]), {"t": voice})
    assert handler.finish(600)
    errors = [s for s in rec.statuses() if s["status"] == "error" and s.get("command") == "change_voice"]
    assert [e["voice"] for e in errors] == [VOICE] * len(FAULTS)
    for e in errors:
        print(e["message"][:160])
    assert [s["voice"] for s in rec.statuses() if s["status"] == "voice_changed"] == ["Stereo", "EightK"]
    done = rec.completes()
    assert [o for o, _ in done] == ["completed"] * (len(FAULTS) + 2)
    spoken = [s["voice"] for s in rec.statuses() if s["status"] == "done"]
    assert spoken == [VOICE] * len(FAULTS) + ["Stereo", "EightK"]


def test_a_voice_folder_deleted_while_running_keeps_serving(tmp_path):
    root = tmp_path / "models"
    root.mkdir()
    own = tmp_path / "own"
    own.mkdir()
    files = {k: shutil.copy(checkpoint(k), own / checkpoint(k).name) for k in ("gpt", "sovits")}
    files["reference"] = shutil.copy(reference_wav(), own / "ref.wav")
    _variant(root, "Own", **files)
    handler, rec = _handler(root, "Own")
    handler.on_input("text", pa.array([TEXT]), {"t": 0})
    assert handler.wait_idle(300)
    shutil.rmtree(own)
    handler.on_input("text", pa.array([TEXT]), {"t": 1})
    handler.on_input("control", pa.array(["change_voice:Own"]), {})  # reloading from the deleted folder fails
    handler.on_input("text", pa.array([TEXT]), {"t": 2})
    assert handler.finish(300)
    assert [o for o, _ in rec.completes()] == ["completed"] * 3
    assert [s for s in rec.statuses() if s["status"] == "error" and s.get("command") == "change_voice"]


@pytest.mark.slow
@pytest.mark.tiered
def test_per_request_voices_stay_within_the_cache_bound(tmp_path):
    """Requests cycling over 6 voices with their own GPT files (8 of them, each loading a voice; 50 under --full):
    the cache holds the current voice plus at most PRIMESPEECH_VOICE_CACHE others."""
    requests = 50 if full_run() else 8
    root = make_model_dir(tmp_path / "models")
    names = []
    for i in range(6):
        gpt = tmp_path / f"gpt{i}.ckpt"
        shutil.copy(checkpoint("gpt"), gpt)
        names.append(_variant(root, f"Cycle{i}", gpt=gpt))
    handler, rec = _handler(root, PRIMESPEECH_VOICE_CACHE="2")
    engine = handler.engine
    peak = 0
    for i in range(requests):
        handler.on_input("text", pa.array([f"VOICE:{names[i % len(names)]}|{TEXT}"]), {"t": i})
        assert handler.wait_idle(300)
        gpts = [m for m in engine.stats()["loaded_models"] if m.startswith("gpt:")]
        peak = max(peak, len(gpts))
        assert len(engine.cache.voices()) <= 3
    assert handler.finish(60)
    assert [o for o, _ in rec.completes()] == ["completed"] * requests
    assert peak == 3, "the current voice's GPT plus two per-request voices"
    assert engine.stats()["cached_voices"][-1] == names[(requests - 1) % len(names)]
