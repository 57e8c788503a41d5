"""A v2Pro / v2ProPlus voice through GPTSoVITSEngine: every end-to-end case of models-v2pro/cases.json
(the original's whole ``TTS.run``), then streaming with such a voice, and the clear error when its
speaker-verification model is missing.

The voice is the case's GPT/HuBERT/BERT (reused from the v2 set), its v2Pro-family SoVITS, the sv model and
the reference clip. As in test_engine.py, HuBERT gets the golden's 16 kHz input and SoVITS the golden's prior
noise; the sv embedding is computed by the engine itself from the 32 kHz reference (our resampler, fbank and
ERes2NetV2). Tolerances come from each case.
"""

from __future__ import annotations

import dataclasses
import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from conftest import fixtures_root, param_or_missing, require_case, require_fixture
from test_engine import ReplayNoise, golden_settings, model_dir  # noqa: F401  (shared fixture)

from dora_primespeech_mlx.assets.catalog import VoiceSpec
from dora_primespeech_mlx.engine import GPTSoVITSEngine, SynthesisConfig
from dora_primespeech_mlx.errors import VoiceNotInstalledError
from dora_primespeech_mlx.models.hubert.model import PROMPT_TAIL_SAMPLES

SET = "models-v2pro"
FAST = SynthesisConfig(text_split_method="cut0")


@lru_cache(maxsize=1)
def cases_json() -> dict:
    path = fixtures_root() / SET / "cases.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


E2E = [c for c in cases_json().get("cases", []) if "gpt" in str(c.get("model", "")).split(" + ")]
E2E_PARAMS = param_or_missing(E2E, lambda c: c["name"], f"{SET}/cases.json e2e cases")


def _file(rel: str) -> Path:
    return require_fixture(str(Path(SET) / rel))


def _sovits_rel(case: dict) -> str:
    ck = cases_json()["checkpoints"]
    parts = [p.strip() for p in str(case["model"]).split("+")]
    (key,) = [k for k in ck if k.startswith("sovits") and k in parts]
    return ck[key]


def v2pro_voice(case: dict, **changes) -> VoiceSpec:
    ck = cases_json()["checkpoints"]
    inp = case["inputs"]
    spec = VoiceSpec(
        name=f"fixture-{case['name']}",
        language=inp["text_lang"],
        prompt_text=inp["prompt_text"],
        prompt_lang=inp["prompt_lang"],
        speed_factor=float(inp.get("speed_factor", 1.0)),
        gpt=_file(ck["gpt"]),
        sovits=_file(_sovits_rel(case)),
        reference=_file(inp["ref_audio_path"]),
        hubert=_file(ck["hubert"]),
        bert=_file(ck["bert"]),
        source="custom",
        sv=_file(ck["sv"]),
    )
    return dataclasses.replace(spec, **changes)


@pytest.mark.parametrize("case", E2E_PARAMS)
def test_v2pro_e2e_golden(case, model_dir, monkeypatch):  # noqa: F811
    case = require_case(case, f"{SET}/cases.json")
    inp, tol = case["inputs"], case["tolerance"]
    if int(inp["top_k"]) != 1:
        pytest.skip("the golden sampled with torch's RNG (top_k > 1): tokens are not reproducible")
    golden = np.load(_file(case["file"]))
    voice = v2pro_voice(case)
    assert voice.needs_sv and voice.installed

    eng = GPTSoVITSEngine(model_dir=model_dir, config=FAST)
    if "wav16k" in golden.files:  # the HuBERT input (prompt mode); absent in reference-free mode
        wav16k = golden["wav16k"]
        monkeypatch.setattr(eng.references, "load_16k", lambda path, wav, sr: wav16k[:-PROMPT_TAIL_SAMPLES])
    replay = ReplayNoise(golden["noise"])
    monkeypatch.setattr(eng, "noise_bank", lambda seed, channels: replay)
    result = eng.synthesize(inp["text"], voice=voice, **golden_settings(case))

    (key,) = eng.cache.keys("reference")
    ref = eng.cache.peek(key)
    report = []
    if "prompt_semantic" in golden.files:
        np.testing.assert_array_equal(ref.prompt_semantic, golden["prompt_semantic"])
    else:
        assert ref.prompt_semantic is None, "reference-free mode: no prompt tokens"
    assert tol["semantic_tokens"] == "exact"
    np.testing.assert_array_equal(result.semantic_tokens, golden["semantic_tokens"])
    assert len(result.semantic_tokens) == case["n_semantic_tokens"]
    assert result.sample_rate == case["output_sample_rate"]
    assert len(replay.calls) == 1, "the golden decodes its one chunk once"
    ge_err = float(np.abs(np.array(ref.ge) - golden["ge"]).max())
    report.append(f"ge (engine, our sv_emb) max|err| {ge_err:.3g}")

    sovits_audio = golden["sovits_audio"]
    err_audio = float(np.abs(result.audio[: len(sovits_audio)] - sovits_audio).max())
    out = (result.audio * 32768).astype(np.int16)
    assert out.shape == golden["output_int16"].shape
    err_int16 = int(np.abs(out.astype(np.int64) - golden["output_int16"]).max())
    report.append(f"sovits_audio max|err| {err_audio:.3g} (atol {tol['sovits_audio']['atol']}), "
                  f"output_int16 max|err| {err_int16} (atol {tol['output_int16']['atol']})")
    print(f"\n[{case['name']} / engine] " + "; ".join(report))
    assert err_audio <= tol["sovits_audio"]["atol"]
    assert err_int16 <= tol["output_int16"]["atol"]


@pytest.fixture(scope="module")
def v2pro_engine(model_dir):  # noqa: F811
    case = require_case(E2E[0] if E2E else None, f"{SET}/cases.json")
    eng = GPTSoVITSEngine(model_dir=model_dir, config=FAST)
    eng.load_voice(v2pro_voice(case))
    return eng


def test_v2pro_stream_matches_whole_utterance(v2pro_engine):
    """Streaming with a v2Pro voice: the windows get the cached gin-wide ge (MRTE's projection happens inside
    the model), so the stream equals the whole decode up to the window context effects, as for v2."""
    text = "Hello world, this is a small test."
    whole = v2pro_engine.synthesize(text, speed_factor=1.0, text_split_method="cut0", top_k=1, seed=7)
    n = len(whole.semantic_tokens)  # the fixture GPT decides how many; windows scaled to give several seams
    assert n >= 8, f"the fixture GPT speaks {n} tokens for {text!r}: too few for a stream of several windows"
    chunk = max(2, n // 5)
    small = {"stream_first_tokens": max(2, n // 4), "stream_chunk_tokens": chunk,
             "stream_context_tokens": min(8, chunk), "stream_lookahead_tokens": min(3, chunk - 1),
             "text_split_method": "cut0", "top_k": 1, "seed": 7}
    chunks = list(v2pro_engine.synthesize_stream(text, speed_factor=1.0, **small))
    streamed = np.concatenate([c.audio for c in chunks])
    gap = int(0.3 * whole.sample_rate)
    assert len(chunks) >= 3 and len(streamed) == len(whole.audio)
    rel = float(np.linalg.norm(streamed[:-gap] - whole.audio[:-gap]) / np.linalg.norm(whole.audio[:-gap]))
    print(f"v2Pro stream: {len(chunks)} chunks, relative L2 error vs whole {rel:.3f}")
    assert rel < 0.3
    assert v2pro_engine.stats()["loaded_models"].count("sv:" + Path(v2pro_engine.voice.sv).name) == 1


def test_v2pro_voice_without_sv_model_is_not_installed(tmp_path):
    case = require_case(E2E[0] if E2E else None, f"{SET}/cases.json")
    voice = v2pro_voice(case, sv=tmp_path / "missing-sv.ckpt")
    assert not voice.installed and voice.missing_files() == [tmp_path / "missing-sv.ckpt"]
    eng = GPTSoVITSEngine(model_dir=tmp_path, config=FAST)
    with pytest.raises(VoiceNotInstalledError, match="missing-sv.ckpt"):
        eng.load_voice(voice)
