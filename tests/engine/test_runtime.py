"""The engine's runtime (runtime.py): resolved once per engine from its settings, handed to every loader, so two
engines with different runtimes run side by side in one process, each giving what it gives alone.

The voice is the fixture checkpoints with the e2e case's reference clip and prompt (as in test_engine.py).
"""

from __future__ import annotations

import gc
import importlib.util

import numpy as np
import pytest
from conftest import model_cases, param_or_missing, text_data_env
from test_engine import fixture_voice

from dora_primespeech_mlx.assets.catalog import VoiceSpec
from dora_primespeech_mlx.engine import GPTSoVITSEngine, SynthesisConfig
from dora_primespeech_mlx.errors import ConfigError
from dora_primespeech_mlx.models.sovits import conv, vocoder
from dora_primespeech_mlx.runtime import Runtime
from dora_primespeech_mlx.settings import Settings

E2E_PARAMS = param_or_missing(model_cases("e2e"), lambda c: c["name"], "models/cases.json e2e case")
HAS_ORT = importlib.util.find_spec("onnxruntime") is not None

# Two runtimes that differ in every load-time choice the fixture voice exercises: the GPT's decode step, the
# SoVITS convolutions and the vocoder backend.
EAGER = Runtime(t2s_decode="mlx", t2s_compile=False, conv_impl="native", vocoder="mlx")
FAST = Runtime(t2s_decode="numpy", conv_impl="gemm", vocoder="onnx" if HAS_ORT else "mlx")




def _engine(model_dir, runtime: Runtime, voice: VoiceSpec) -> GPTSoVITSEngine:
    eng = GPTSoVITSEngine(model_dir=model_dir, config=SynthesisConfig(text_split_method="cut0"),
                          settings=Settings.from_env(text_data_env()), runtime=runtime)
    eng.load_voice(voice)
    return eng


def _speak(eng: GPTSoVITSEngine, case: dict) -> tuple[np.ndarray, np.ndarray]:
    inp = case["inputs"]
    res = eng.synthesize(inp["text"], text_lang=inp["text_lang"], top_k=1, seed=1)
    return res.audio, res.semantic_tokens


def _loaded(eng: GPTSoVITSEngine, kind: str):
    (model,) = [eng.cache.peek(k) for k in eng.cache.keys(kind)]
    return model


@pytest.mark.parametrize("case", E2E_PARAMS)
def test_two_runtimes_side_by_side_match_each_alone(case, tmp_path):
    voice = fixture_voice(case, name="fixture-runtime")
    alone = {}
    for name, runtime in (("eager", EAGER), ("fast", FAST)):
        eng = _engine(tmp_path, runtime, voice)
        alone[name] = _speak(eng, case)
        del eng
        gc.collect()

    engines = {"eager": _engine(tmp_path, EAGER, voice), "fast": _engine(tmp_path, FAST, voice)}
    for _round in range(2):  # interleaved: each engine's requests between the other's
        for name, eng in engines.items():
            audio, tokens = _speak(eng, case)
            np.testing.assert_array_equal(tokens, alone[name][1], err_msg=f"{name}: tokens differ beside the other")
            np.testing.assert_allclose(audio, alone[name][0], atol=1e-6, err_msg=f"{name}: audio differs beside")

    eager, fast = engines["eager"], engines["fast"]  # each engine's models follow its own runtime
    assert eager.runtime == EAGER and fast.runtime == FAST  # (each with a thread plan of its own, from its settings)
    assert eager.runtime.threads is not None and eager.runtime.threads is not fast.runtime.threads
    assert _loaded(eager, "gpt").decoder.kind == "mlx" and _loaded(fast, "gpt").decoder.kind == "numpy"
    for eng, impl in ((eager, "native"), (fast, "gemm")):
        sovits = _loaded(eng, "sovits")
        convs = [m for _, m in sovits.named_modules() if isinstance(m, (conv.Conv1d, conv.ConvTranspose1d))]
        assert convs and {m.impl for m in convs} == {impl} and sovits.conv_impl == impl
    assert vocoder.status(_loaded(eager, "sovits"))["backend"] == "mlx"
    if HAS_ORT:
        assert vocoder.status(_loaded(fast, "sovits"))["backend"] != "mlx"
    assert eager.stats()["backends"]["gpt"] != fast.stats()["backends"]["gpt"]


def test_runtime_from_settings_and_checks():
    s = Settings.from_env({"PRIMESPEECH_VOCODER": "mlx", "PRIMESPEECH_T2S_DECODE": "numpy", "DEVICE": "cpu",
                           "PRIMESPEECH_CONV_IMPL": "native", "PRIMESPEECH_ISA": "none"})
    rt = Runtime.from_settings(s)
    assert (rt.vocoder, rt.t2s_decode, rt.device, rt.conv_impl, rt.isa) == ("mlx", "numpy", "cpu", "native", "none")
    assert Runtime.from_settings(Settings.from_env({})) == Runtime()  # the settings' defaults are the runtime's
    assert rt.replace(vocoder="onnx").vocoder == "onnx" and rt.vocoder == "mlx"
    with pytest.raises(ConfigError, match="vocoder='fast'"):
        Runtime(vocoder="fast")
    with pytest.raises(ConfigError, match="conv_impl"):
        rt.replace(conv_impl="fft")


def test_engine_takes_its_runtime_from_settings_and_arguments(tmp_path):
    s = Settings.from_env({"PRIMESPEECH_VOCODER": "mlx", "PRIMESPEECH_ENCODERS": "mlx", "DEVICE": "cpu"})
    eng = GPTSoVITSEngine(model_dir=tmp_path, settings=s)
    assert eng.runtime == Runtime.from_settings(s) and eng.encoders == "mlx" and "cpu" in eng.device_name
    eng = GPTSoVITSEngine(model_dir=tmp_path, settings=s, runtime=Runtime(vocoder="onnx"), device="cpu")
    assert eng.runtime.vocoder == "onnx" and eng.runtime.device == "cpu" and eng.runtime.encoders == "auto"
    with pytest.raises(ConfigError, match="encoders"):
        GPTSoVITSEngine(model_dir=tmp_path, settings=s, encoders="ane")
    with pytest.raises(ConfigError, match="runtime must be a Runtime"):
        GPTSoVITSEngine(model_dir=tmp_path, settings=s, runtime={"vocoder": "mlx"})
