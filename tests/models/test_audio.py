"""Audio utilities (models/audio.py): wav reading, soxr resampling, the reference spectrogram and the
pipeline's int16 output, against the golden arrays of the original pipeline where they exist."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
from audio_testlib import to_int16_output
from conftest import model_cases, param_or_missing, require_case, require_fixture

from dora_primespeech_mlx.models import audio

SPEC_CASES = [c for c in model_cases() if "refer_spec" in c.get("outputs", {})]
SPEC_PARAMS = param_or_missing(SPEC_CASES, lambda c: c["name"], "cases with a refer_spec")
E2E_PARAMS = param_or_missing(model_cases("e2e"), lambda c: c["name"], "models/cases.json e2e case")


def _load(case):
    case = require_case(case, "models/cases.json")
    return case, np.load(require_fixture("models/" + case["file"]))


def _spec_tolerance(case):
    for key, tol in case.get("tolerance", {}).items():
        if "refer_spec" in [k.strip() for k in key.split("/")]:
            return tol
    return None


@pytest.mark.parametrize("case", SPEC_PARAMS)
def test_spectrogram_matches_golden(case):
    case, d = _load(case)
    if "ref_wav_32k" in d.files:
        wav = d["ref_wav_32k"]
    else:  # the end-to-end case stores the 16-bit file's samples, read as torchaudio does (int16 / 32768)
        wav = d["ref_wav_32k_int16"].astype(np.float32) / 32768.0
    params = case.get("params", {})
    spec = audio.spectrogram(
        wav, params.get("filter_length", 2048), params.get("hop_length", 640), params.get("win_length", 2048)
    )
    golden = d["refer_spec"]
    assert spec.shape == golden.shape and spec.dtype == np.float32
    # F = (N + 2 * 704 - 2048) // 640 + 1
    assert spec.shape[-1] == (len(wav) + 2 * 704 - 2048) // 640 + 1
    tol = _spec_tolerance(case)
    err = float(np.max(np.abs(spec - golden)))
    print(f"\n[{case['name']}] refer_spec max|err| {err:.3g} (tolerance {tol})")
    if tol is None:  # no tolerance recorded for this case: the decode cases' refer_spec tolerance
        tol = next((t for c in SPEC_CASES if (t := _spec_tolerance(c)) is not None), None)
        assert tol is not None, "cases.json records no refer_spec tolerance for any case"
    np.testing.assert_allclose(spec, golden, atol=tol.get("atol", 0.0), rtol=tol.get("rtol", 0.0))


def test_spectrogram_basics():
    sr = 32000
    t = np.arange(sr) / sr
    tone = (0.5 * np.sin(2 * np.pi * 1000 * t)).astype(np.float32)
    spec = audio.spectrogram(tone)
    assert spec.shape == (1, 1025, (sr + 1408 - 2048) // 640 + 1)
    assert np.all(np.argmax(spec[0, :, 2:-2], axis=0) == 64)  # 1000 Hz / (32000 / 2048) = bin 64
    assert np.allclose(audio.spectrogram(np.zeros(4000, np.float32)), 1e-4)  # sqrt(1e-8)
    np.testing.assert_array_equal(audio.spectrogram(tone[None]), spec)
    with pytest.raises(ValueError, match="mono"):
        audio.spectrogram(np.zeros((2, 4000), np.float32))


@pytest.mark.parametrize("case", E2E_PARAMS)
def test_load_wav_and_resample_like_librosa(case):
    case, d = _load(case)
    path = require_fixture("models/" + case["inputs"]["ref_audio_path"])
    wav, sr = audio.load_wav(path)
    assert wav.dtype == np.float32 and wav.ndim == 1
    np.testing.assert_array_equal(wav, d["ref_wav_32k_int16"].astype(np.float32) / 32768.0)
    # wav16k = librosa.load(ref, sr=16000) (soxr_hq) + int(32000 * 0.3) zeros
    n_zeros = int(case.get("output_sample_rate", 32000) * 0.3)
    golden = d["wav16k"][: len(d["wav16k"]) - n_zeros]
    ours = audio.resample(wav, sr, 16000)
    assert ours.shape == golden.shape
    err = float(np.max(np.abs(ours - golden)))
    print(f"\n[{case['name']}] resample 32k->16k vs librosa soxr_hq: max|err| {err:.3g}")
    # Same library and quality as librosa's soxr_hq; bit-matching is not required by the fixtures, so a
    # small margin (-80 dB) is allowed.
    assert err < 1e-4


def test_load_wav_mixes_stereo_down(tmp_path):
    left = np.linspace(-0.5, 0.5, 1000, dtype=np.float32)
    right = np.full(1000, 0.25, dtype=np.float32)
    path = tmp_path / "stereo.wav"
    sf.write(path, np.stack([left, right], axis=1), 22050, subtype="FLOAT")
    wav, sr = audio.load_wav(path)
    assert sr == 22050
    np.testing.assert_allclose(wav, (left + right) / 2, atol=1e-7)
    with pytest.raises(ValueError, match="cannot read audio file"):
        audio.load_wav(tmp_path / "missing.wav")


def test_resample_lengths():
    x = np.random.default_rng(0).standard_normal(44101).astype(np.float32) * 0.1
    y = audio.resample(x, 44100, 32000)
    assert y.dtype == np.float32 and len(y) == int(np.ceil(44101 * 32000 / 44100))
    np.testing.assert_array_equal(audio.resample(x, 16000, 16000), x)


@pytest.mark.parametrize("case", E2E_PARAMS)
def test_int16_output_from_golden_audio(case):
    case, d = _load(case)
    if "output_int16" not in d.files or "sovits_audio" not in d.files:
        pytest.fail(f"{case['name']}: output_int16 / sovits_audio not stored")
    sr = int(case.get("output_sample_rate", 32000))
    interval = float(case["inputs"].get("fragment_interval", 0.3))
    pcm = to_int16_output([d["sovits_audio"]], sr, interval)
    tol = case.get("tolerance", {}).get("output_int16", {"atol": 0})
    assert pcm.dtype == np.int16 and pcm.shape == d["output_int16"].shape
    err = int(np.max(np.abs(pcm.astype(np.int64) - d["output_int16"])))
    print(f"\n[{case['name']}] output_int16 from golden audio: max|err| {err} (atol {tol.get('atol')})")
    assert err <= tol.get("atol", 0)


def test_int16_output_rules():
    sr, interval = 40, 0.05  # int(40 * 0.05) = 2 zeros after every fragment
    a = np.array([0.5, -0.25], np.float32)
    b = np.array([2.0, -1.0], np.float32)  # peak 2 > 1 -> divided by 2
    pcm = to_int16_output([a, b], sr, interval)
    assert pcm.dtype == np.int16 and len(pcm) == 8
    kept = [0, 1, 2, 3, 5, 6, 7]
    np.testing.assert_array_equal(pcm[kept], np.array([16384, -8192, 0, 0, -16384, 0, 0], dtype=np.int16))
    # 1.0 * 32768 does not fit int16: like the original, no clipping is applied (plain astype)
    assert pcm[4] == np.array([32768.0], np.float32).astype(np.int16)[0]
    assert len(to_int16_output([], sr, 0.3)) == 0
