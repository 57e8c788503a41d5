"""The engine runs the SoVITS generator on the backend models/sovits/vocoder.py picks, and says so in stats().

On MLX's CPU device the default (``PRIMESPEECH_VOCODER=auto``) is ONNX Runtime, with its graph cached next
to the converted SoVITS model; ``PRIMESPEECH_VOCODER=mlx`` keeps MLX. Both give the same audio within the
e2e case's SoVITS tolerance. Parity with the goldens: tests/models/test_vocoder_onnx.py and the engine's
e2e golden test (which runs with the default backend). With ONNX Runtime serving, the MLX generator weights are
not resident; an ONNX Runtime failure forced at the first run reads them back and MLX gives the MLX run's audio.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from conftest import load_cases_json, model_cases, param_or_missing, require_case, require_fixture

from dora_primespeech_mlx.assets.catalog import VoiceSpec
from dora_primespeech_mlx.engine import GPTSoVITSEngine, SynthesisConfig

pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (a Linux dependency)")

E2E_PARAMS = param_or_missing(model_cases("e2e"), lambda c: c["name"], "models/cases.json e2e case")


def _voice(case: dict) -> VoiceSpec:
    ck = load_cases_json()["checkpoints"]
    inp = case["inputs"]
    return VoiceSpec(
        name="fixture-vocoder",
        language=inp["text_lang"],
        prompt_text=inp["prompt_text"],
        prompt_lang=inp["prompt_lang"],
        speed_factor=float(inp.get("speed_factor", 1.0)),
        gpt=require_fixture("models/" + ck["gpt"]),
        sovits=require_fixture("models/" + ck["sovits"]),
        reference=require_fixture("models/" + inp["ref_audio_path"]),
        hubert=require_fixture("models/" + ck["hubert"]),
        bert=require_fixture("models/" + ck["bert"]),
        source="custom",
    )


def _run(case, model_dir, monkeypatch, mode: str, break_onnx: bool = False):
    monkeypatch.setenv("PRIMESPEECH_VOCODER", mode)
    eng = GPTSoVITSEngine(model_dir=model_dir, config=SynthesisConfig(text_split_method="cut0"))
    voice = _voice(case)
    eng.load_voice(voice)
    inp = case["inputs"]
    if break_onnx:  # ONNX Runtime fails at the first run: MLX takes over (weights read back from the file)
        (sovits,) = [eng.cache.peek(k) for k in eng.cache.keys("sovits")]

        def broken(z, ge):
            raise RuntimeError("simulated onnxruntime failure")

        assert sovits.vocoder_backend.generator is not None
        sovits.vocoder_backend.generator = broken
        sovits.vocoder_backend.split = None  # (with PRIMESPEECH_VOCODER_PARTS > 1 the stretches call the session)
    res = eng.synthesize(inp["text"], text_lang=inp["text_lang"], top_k=1, seed=1)
    return res, eng.stats()["backends"]["sovits"]


@pytest.mark.parametrize("case", E2E_PARAMS)
def test_engine_vocoder_backends(case, tmp_path, monkeypatch):
    case = require_case(case, "models/cases.json")
    if mx.default_device().type != mx.cpu:
        pytest.skip("the automatic ONNX Runtime choice is for MLX on the CPU")
    onnx_res, onnx_st = _run(case, tmp_path, monkeypatch, "auto")
    assert onnx_st["backend"] == "onnxruntime" and onnx_st["calls"]["onnx"] >= 1, onnx_st
    assert onnx_st["mlx_weights"]["dropped"], "the MLX generator weights stayed resident next to ONNX Runtime's"
    assert onnx_st["path"] and str(tmp_path) in onnx_st["path"], "graph not cached next to the converted model"
    cached = list(tmp_path.rglob("sovits-generator-*.onnx"))
    assert len(cached) == 1
    mlx_res, mlx_st = _run(case, tmp_path, monkeypatch, "mlx")
    assert mlx_st["backend"] == "mlx" and mlx_st["calls"]["onnx"] == 0 and mlx_st["calls"]["mlx"] >= 1, mlx_st
    assert list(tmp_path.rglob("sovits-generator-*.onnx")) == cached  # built once
    atol = float(case["tolerance"]["sovits_audio"]["atol"])
    assert np.array_equal(onnx_res.semantic_tokens, mlx_res.semantic_tokens)
    diff = float(np.max(np.abs(np.asarray(onnx_res.audio) - np.asarray(mlx_res.audio))))
    assert diff <= atol, f"ONNX Runtime vs MLX vocoder in the engine: max|diff| {diff} > {atol}"
    # ONNX Runtime failing after the MLX generator weights were dropped: MLX answers, with the same audio
    fb_res, fb_st = _run(case, tmp_path, monkeypatch, "auto", break_onnx=True)
    assert fb_st["backend"] == "mlx" and "simulated" in fb_st["error"] and fb_st["calls"]["onnx"] == 0, fb_st
    assert fb_st["mlx_weights"]["restores"] == 1 and not fb_st["mlx_weights"]["dropped"], fb_st
    assert np.array_equal(fb_res.semantic_tokens, mlx_res.semantic_tokens)
    np.testing.assert_array_equal(np.asarray(fb_res.audio), np.asarray(mlx_res.audio))


@pytest.mark.parametrize("case", E2E_PARAMS)
@pytest.mark.parametrize("spin", ["1", "0", None])
def test_engine_passes_the_spin_setting_to_the_session(case, tmp_path, monkeypatch, spin):
    """PRIMESPEECH_VOCODER_SPIN reaches the ONNX Runtime session the engine loads (unset: auto, off)."""
    case = require_case(case, "models/cases.json")
    if mx.default_device().type != mx.cpu:
        pytest.skip("the ONNX Runtime vocoder serves where MLX runs on the CPU")
    monkeypatch.setenv("PRIMESPEECH_VOCODER", "onnx")
    if spin is None:
        monkeypatch.delenv("PRIMESPEECH_VOCODER_SPIN", raising=False)
    else:
        monkeypatch.setenv("PRIMESPEECH_VOCODER_SPIN", spin)
    eng = GPTSoVITSEngine(model_dir=tmp_path, config=SynthesisConfig(text_split_method="cut0"))
    eng.load_voice(_voice(case))
    st = eng.stats()["backends"]["sovits"]
    session = [eng.cache.peek(k) for k in eng.cache.keys("sovits")][0].vocoder_backend.generator.session
    assert st["backend"] == "onnxruntime" and st["spin"] is (spin == "1"), st
    assert session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == (spin or "0")


@pytest.mark.parametrize("case", E2E_PARAMS)
def test_engine_vocoder_on_openvino(case, tmp_path, monkeypatch):
    """PRIMESPEECH_VOCODER=openvino: the engine's SoVITS runs its generator on OpenVINO (float32) from the cached
    graph, drops the MLX generator weights, speaks what the MLX generator speaks, and falls back to MLX (weights read
    back, same audio) when an OpenVINO run fails."""
    pytest.importorskip("openvino", reason="openvino is not installed (the extra `openvino`; `.[dev]` has it)")
    case = require_case(case, "models/cases.json")
    ov_res, ov_st = _run(case, tmp_path, monkeypatch, "openvino")
    assert ov_st["backend"] == "openvino" and ov_st["precision"] == "f32" and ov_st["calls"]["onnx"] >= 1, ov_st
    assert ov_st["mlx_weights"]["dropped"], "the MLX generator weights stayed resident next to OpenVINO's"
    assert ov_st["path"] and str(tmp_path) in ov_st["path"], "graph not cached next to the converted model"
    mlx_res, _ = _run(case, tmp_path, monkeypatch, "mlx")
    atol = float(case["tolerance"]["sovits_audio"]["atol"])
    assert np.array_equal(ov_res.semantic_tokens, mlx_res.semantic_tokens)
    diff = float(np.max(np.abs(np.asarray(ov_res.audio) - np.asarray(mlx_res.audio))))
    assert diff <= atol, f"OpenVINO vs MLX vocoder in the engine: max|diff| {diff} > {atol}"
    fb_res, fb_st = _run(case, tmp_path, monkeypatch, "openvino", break_onnx=True)
    assert fb_st["backend"] == "mlx" and "simulated" in fb_st["error"] and "openvino" in fb_st["error"], fb_st
    assert fb_st["mlx_weights"]["restores"] == 1, fb_st
    np.testing.assert_array_equal(np.asarray(fb_res.audio), np.asarray(mlx_res.audio))
