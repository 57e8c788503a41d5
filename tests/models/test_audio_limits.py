"""Reference audio is checked from its header before it is decoded (docs/security.md, "Reference audio"):
each hostile file is refused quickly, naming the limit, with little memory."""

from __future__ import annotations

import os
import re
import threading
import time
import tracemalloc
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf

from dora_primespeech_mlx.errors import ConfigError
from dora_primespeech_mlx.models import audio


def _refused(path, match, **kw):
    """load_wav(path) raises ValueError matching ``match`` within a second, allocating under 8 MB (run in a
    thread of its own so a reader that blocks fails the test instead of hanging it)."""
    out: dict = {}

    def run():
        tracemalloc.start()
        t0 = time.monotonic()
        try:
            audio.load_wav(path, **kw)
        except ValueError as exc:
            out["error"] = exc
        out["seconds"] = time.monotonic() - t0
        out["peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(15)
    assert not worker.is_alive(), "load_wav blocked"
    assert "error" in out, "load_wav accepted the file"
    assert re.search(match, str(out["error"])), str(out["error"])
    assert out["seconds"] < 1.0, out
    assert out["peak"] < 8 * 2**20, out
    return out["error"]


def test_a_1_hz_wav_is_refused_by_its_rate(tmp_path):
    path = tmp_path / "one_hz.wav"
    sf.write(path, np.full(7200, 1000, np.int16), 1)  # 14 KB, two hours at 1 Hz
    _refused(path, r"sample rate of 1 Hz.*MIN_RATE")


def test_a_many_channel_file_is_refused_by_its_channels(tmp_path):
    path = tmp_path / "nine.wav"
    sf.write(path, np.zeros((16000, audio.MAX_CHANNELS + 1), np.int16), 16000)
    _refused(path, rf"{audio.MAX_CHANNELS + 1} channels; the limit is {audio.MAX_CHANNELS}")


def test_a_long_flac_named_wav_is_refused_from_its_header(tmp_path):
    """8 channels at 96 kHz claiming 16 minutes (the STREAMINFO's sample count), under the name ``.wav``."""
    flac = tmp_path / "short.flac"
    sf.write(flac, np.zeros((96000, 8), np.int16), 96000, format="FLAC")
    data = bytearray(flac.read_bytes())
    fields = int.from_bytes(data[18:26], "big")  # rate (20 bits) channels (3) bits (5) total samples (36)
    data[18:26] = ((fields & ~((1 << 36) - 1)) | 16 * 60 * 96000).to_bytes(8, "big")
    path = tmp_path / "long.wav"
    path.write_bytes(bytes(data))
    assert sf.info(str(path)).frames == 16 * 60 * 96000
    _refused(path, r"lasts 960.0 s; the limit is 30 s")


def test_a_long_wav_is_refused_before_decoding(tmp_path):
    path = tmp_path / "long.wav"
    sf.write(path, np.zeros(48000 * 120, np.int16), 48000)  # two minutes: 23 MB as float32 if decoded
    err = _refused(path, r"lasts 120.0 s; the limit is 30 s")
    assert isinstance(err, audio.ClipTooLongError) and err.seconds == 120.0
    _refused(path, r"lasts 120.0 s; the limit is 10 s", max_seconds=10.0)


def test_a_fifo_is_refused_without_blocking(tmp_path):
    path = tmp_path / "ref.wav"
    os.mkfifo(path)
    _refused(path, "not a regular file")
    _refused(tmp_path, "not a regular file")  # a folder


@pytest.mark.parametrize("value,match", [(1e20, "over the limit of 100 times full scale"),
                                         (float("nan"), "NaN or infinite"), (float("inf"), "NaN or infinite")])
def test_float_samples_out_of_range_are_refused(tmp_path, value, match):
    wav = np.sin(np.linspace(0, 2000, 16000 * 4)).astype(np.float32) * 0.5
    wav[1000] = value
    path = tmp_path / "float.wav"
    sf.write(path, wav, 16000, subtype="FLOAT")
    _refused(path, match)


def test_loud_but_usable_float_audio_loads(tmp_path):
    wav = np.sin(np.linspace(0, 2000, 16000 * 4)).astype(np.float32) * 3.0  # overs, as a float file may hold
    path = tmp_path / "loud.wav"
    sf.write(path, wav, 16000, subtype="FLOAT")
    got, sr = audio.load_wav(path)
    assert sr == 16000 and np.allclose(got, wav)


def test_a_stalled_read_is_given_up(monkeypatch, tmp_path):
    release = threading.Event()
    monkeypatch.setattr(audio, "_read_checked", lambda name, max_seconds: release.wait(30))
    t0 = time.monotonic()
    try:
        with pytest.raises(ValueError, match="no answer within 0.3 s"):
            audio.load_wav(tmp_path / "slow.wav", timeout=0.3)
    finally:
        release.set()
    assert time.monotonic() - t0 < 2


def test_the_reference_refuses_a_long_clip_as_the_3_to_10_s_rule(tmp_path):
    from dora_primespeech_mlx.engine.reference import ReferenceBuilder

    path = tmp_path / "long.wav"
    sf.write(path, np.zeros(32000 * 25, np.int16), 32000)
    with pytest.raises(ConfigError, match=r"25.00 s long; GPT-SoVITS needs a 3-10 s clip"):
        ReferenceBuilder().load(path, SimpleNamespace(sampling_rate=32000))
    sf.write(path, np.full(32000 * 4, 1e20, np.float32), 32000, subtype="FLOAT")
    with pytest.raises(ConfigError, match="MAX_PEAK"):
        ReferenceBuilder().load(path, SimpleNamespace(sampling_rate=32000))
