"""GPTSoVITSEngine on the tiny fixture models: the e2e golden of the original GPT-SoVITS, request
settings, the reference cache, text routing (English without BERT, Chinese with), errors, stats.

The voice is built from the fixture files named in models/cases.json (GPT, SoVITS, HuBERT, BERT) and
the e2e case's reference clip and prompt. Streaming has its own file (test_engine_stream.py).
"""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from conftest import load_cases_json, load_text_data, model_cases, param_or_missing, require_case, require_fixture

import dora_primespeech_mlx.models.gpt.generate as t2s_generate
from dora_primespeech_mlx.assets.catalog import VoiceSpec
from dora_primespeech_mlx.engine import GPTSoVITSEngine, SynthesisConfig, SynthesisResult, pipeline
from dora_primespeech_mlx.errors import ConfigError, NothingToSpeakError, SynthesisError
from dora_primespeech_mlx.models.hubert.model import PROMPT_TAIL_SAMPLES
from dora_primespeech_mlx.text import TextFrontendError, UnsupportedLanguageError

DATA = load_text_data()  # the text front end's folders (tests/conftest.py)

E2E_CASES = model_cases("e2e")
E2E_PARAMS = param_or_missing(E2E_CASES, lambda c: c["name"], "models/cases.json e2e case")
# One chunk per request keeps the tests fast (the tiny GPT speaks up to 50 * max_sec tokens whatever the text);
# everything else is the engine's default.
FAST = SynthesisConfig(text_split_method="cut0")


# ---- helpers --------------------------------------------------------------------------------------


def fixture_voice(case: dict, **changes) -> VoiceSpec:
    """A voice made of the fixture checkpoints and the case's reference clip and prompt."""
    ck = load_cases_json()["checkpoints"]
    inp = case["inputs"]
    spec = VoiceSpec(
        name=f"fixture-{case['name']}",
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
    return dataclasses.replace(spec, **changes)


def golden_settings(case: dict) -> dict:
    """The case's request settings as engine overrides."""
    inp = case["inputs"]
    return {
        "text_lang": inp["text_lang"],
        "prompt_lang": inp["prompt_lang"],
        "top_k": int(inp["top_k"]),
        "top_p": float(inp["top_p"]),
        "temperature": float(inp["temperature"]),
        "repetition_penalty": float(inp["repetition_penalty"]),
        "text_split_method": inp["text_split_method"],
        "speed_factor": float(inp["speed_factor"]),
        "fragment_interval": float(inp["fragment_interval"]),
        "seed": int(inp["seed"]),
    }


def bert_width(voice: VoiceSpec) -> int:
    """hidden_size of the voice's BERT (the fixture's config.json)."""
    return int(json.loads((Path(voice.bert) / "config.json").read_text(encoding="utf-8"))["hidden_size"])


def bert_tolerance() -> dict:
    """atol/rtol of the BERT phone features, as the set's bert cases give it."""
    tol = next(c["tolerance"]["phone_features"] for c in model_cases("bert") if "phone_features" in c["tolerance"])
    return {"atol": float(tol.get("atol", 0.0)), "rtol": float(tol.get("rtol", 0.0))}


class ReplayNoise:
    """Stands in for the engine's noise bank: hands out the golden's torch.randn draw."""

    def __init__(self, noise: np.ndarray):
        self.noise = noise
        self.calls = []

    def take(self, start: int, n: int) -> np.ndarray:
        self.calls.append((start, n))
        assert start == 0 and n == self.noise.shape[2], f"decode asked for noise frames {start}..{start + n}"
        return self.noise


class GenerateSpy:
    """Wraps t2s_generate.generate and t2s_generate.start (a decode batch's rows) as the pipeline calls them:
    records the inputs and every produced token (a batch row's when it is decoded)."""

    def __init__(self, monkeypatch):
        self.real, self.real_start = t2s_generate.generate, t2s_generate.start
        self.calls: list[dict] = []
        self.events: list[tuple] = []
        self.tokens: dict[int, list[int]] = {}  # call -> its tokens
        monkeypatch.setattr(pipeline, "generate", self)  # where the engine's pipeline calls them
        monkeypatch.setattr(pipeline, "start", self.start)

    def start(self, model, phones, bert, prompt, params, early_stop_num, **kw):
        self.calls.append({"phones": phones, "bert": bert, "prompt": prompt, "params": params,
                           "early_stop_num": early_stop_num, **kw})
        n = len(self.calls) - 1
        gen = self.real_start(model, phones, bert, prompt, params, early_stop_num, **kw)
        choose = gen.choose

        def spied():
            step = choose()
            if step.keep:
                self.events.append(("token", n, step.idx))
                self.tokens.setdefault(n, []).append(step.token)
            if step.stop is not None:
                self.events.append(("end", n))
            return step

        gen.choose = spied
        return gen

    def __call__(self, model, phones, bert, prompt, params, early_stop_num, **kw):
        call = {"phones": phones, "bert": bert, "prompt": prompt, "params": params,
                "early_stop_num": early_stop_num, **kw}
        self.calls.append(call)
        inner = self.real(model, phones, bert, prompt, params, early_stop_num, **kw)

        def wrapped():
            n = len(self.calls) - 1
            for i, tok in enumerate(inner):
                self.events.append(("token", n, i))
                self.tokens.setdefault(n, []).append(int(tok))
                yield tok
            self.events.append(("end", len(self.calls) - 1))

        return wrapped()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """One model dir (converted-weights cache) for every engine test of the session."""
    path = tmp_path_factory.getbasetemp() / "engine-model-dir"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def case():
    return require_case(E2E_CASES[0] if E2E_CASES else None, "models/cases.json")


@pytest.fixture(scope="session")
def voice(case):
    return fixture_voice(case)


@pytest.fixture(scope="session")
def engine(model_dir, voice):
    eng = GPTSoVITSEngine(model_dir=model_dir, config=FAST)
    eng.load_voice(voice)
    return eng


def _reference(eng: GPTSoVITSEngine):
    (key,) = eng.cache.keys("reference")
    return eng.cache.peek(key)


# ---- golden ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", E2E_PARAMS)
def test_e2e_golden(case, model_dir, monkeypatch):
    """synthesize() with the golden's settings reproduces the original's tokens and int16 output.

    The reference's 16 kHz HuBERT input is the stored ``wav16k`` (the README's advice: start from
    it), and SoVITS gets the golden's recorded prior noise. Our own resampling path is checked
    separately (test_reference_prompt_tokens_from_our_resampling)."""
    case = require_case(case, "models/cases.json")
    inp, tol = case["inputs"], case["tolerance"]
    if int(inp["top_k"]) != 1:
        pytest.skip("the golden sampled with torch's RNG (top_k > 1): tokens are not reproducible")
    golden = np.load(require_fixture("models/" + case["file"]))
    wav16k = golden["wav16k"]
    assert not wav16k[-PROMPT_TAIL_SAMPLES:].any(), "stored wav16k should end with the 0.6 s zero tail"

    eng = GPTSoVITSEngine(model_dir=model_dir, config=FAST)
    monkeypatch.setattr(eng.references, "load_16k", lambda path, wav, sr: wav16k[:-PROMPT_TAIL_SAMPLES])
    replay = ReplayNoise(golden["noise"])
    monkeypatch.setattr(eng, "noise_bank", lambda seed, channels: replay)
    result = eng.synthesize(inp["text"], voice=fixture_voice(case), **golden_settings(case))

    ref = _reference(eng)
    np.testing.assert_array_equal(ref.prompt_phones, golden["prompt_phones"])
    np.testing.assert_array_equal(ref.prompt_semantic, golden["prompt_semantic"])
    assert tol["semantic_tokens"] == "exact"
    np.testing.assert_array_equal(result.semantic_tokens, golden["semantic_tokens"])
    assert len(result.semantic_tokens) == case["gpt_stopped_at_idx"]
    assert result.sample_rate == case["output_sample_rate"]
    assert len(replay.calls) == 1, "the golden decodes its one chunk once"

    sovits_audio = golden["sovits_audio"]
    err_audio = np.abs(result.audio[: len(sovits_audio)] - sovits_audio).max()
    out = (result.audio * 32768).astype(np.int16)  # the original's conversion (no clipping)
    assert out.shape == golden["output_int16"].shape
    err_int16 = np.abs(out.astype(np.int64) - golden["output_int16"]).max()
    print(f"{case['name']}: sovits_audio max err {err_audio:.2e} (atol {tol['sovits_audio']['atol']}), "
          f"output_int16 max err {err_int16} (atol {tol['output_int16']['atol']})")
    assert err_audio <= tol["sovits_audio"]["atol"]
    assert err_int16 <= tol["output_int16"]["atol"]
    assert result.duration == pytest.approx(len(out) / result.sample_rate)
    assert result.voice == f"fixture-{case['name']}"
    for stage in ("text", "gpt_prefill", "gpt_decode", "sovits", "total", "reference"):
        assert result.timings[stage] >= 0, stage


@pytest.mark.parametrize("case", E2E_PARAMS)
def test_reference_prompt_tokens_from_our_resampling(case, model_dir):
    """Loading the 32 kHz reference and resampling it ourselves (soxr HQ, as librosa) gives the
    golden's prompt semantic tokens exactly."""
    case = require_case(case, "models/cases.json")
    golden = np.load(require_fixture("models/" + case["file"]))
    eng = GPTSoVITSEngine(model_dir=model_dir, config=FAST)
    eng.load_voice(fixture_voice(case))
    np.testing.assert_array_equal(_reference(eng).prompt_semantic, golden["prompt_semantic"])


# ---- settings -------------------------------------------------------------------------------------


def test_config_defaults_are_the_old_nodes():
    c = SynthesisConfig()
    assert (c.top_k, c.top_p, c.temperature, c.repetition_penalty) == (5, 1.0, 1.0, 1.35)
    assert (c.text_split_method, c.seed, c.fragment_interval, c.noise_scale) == ("cut5", 233333, 0.3, 0.5)
    assert c.speed_factor is None and c.text_lang is None and c.prompt_lang is None
    assert c.replace(top_k=1).top_k == 1 and c.top_k == 5


@pytest.mark.parametrize(
    "name,value",
    [
        ("top_k", 0), ("top_k", 2.5), ("top_k", True), ("top_p", 0.0), ("top_p", 1.5), ("temperature", 0),
        ("repetition_penalty", -1.0), ("speed_factor", 0.1), ("speed_factor", float("nan")),
        ("fragment_interval", -0.1), ("seed", -2), ("seed", "1"), ("text_split_method", "cut9"),
        ("noise_scale", -0.5), ("text_lang", ""), ("stream_first_tokens", 0), ("stream_context_tokens", -1),
        ("stream_crossfade_ms", 100.0),
    ],
)
def test_config_rejects_bad_values(name, value):
    with pytest.raises(ConfigError, match=name):
        SynthesisConfig().replace(**{name: value})


def test_config_rejects_unknown_settings(engine):
    with pytest.raises(ConfigError, match="topk"):
        SynthesisConfig().replace(topk=3)
    with pytest.raises(ConfigError, match="top_k"):
        engine.synthesize("Hello there, friend.", top_k=0)


def test_gpt_gets_request_settings(engine, case, monkeypatch):
    spy = GenerateSpy(monkeypatch)
    engine.synthesize("Hello there, my friend.", config=SynthesisConfig(), text_split_method="cut0")
    (call,) = spy.calls
    p = call["params"]
    assert (p.top_k, p.top_p, p.temperature, p.repetition_penalty) == (5, 1.0, 1.0, 1.35)
    assert call["seed"] == 233333
    assert call["early_stop_num"] == int(50 * load_cases_json()["gpt_config_data_max_sec"])
    # GPT input = prompt phones + target phones, BERT [prompt | target]: the prompt's features are the
    # golden's (zeros when the case's prompt is not Chinese), the English target's are zeros
    ref = _reference(engine)
    n_prompt = len(ref.prompt_phones)
    np.testing.assert_array_equal(call["phones"][0, :n_prompt], ref.prompt_phones)
    np.testing.assert_array_equal(call["prompt"][0], ref.prompt_semantic)
    assert call["bert"].shape == (1, 1024, call["phones"].shape[1])
    golden = np.load(require_fixture("models/" + case["file"]))
    tol = bert_tolerance()
    np.testing.assert_allclose(call["bert"][0, :, :n_prompt], golden["prompt_bert_features"], **tol)
    assert not call["bert"][0, :, n_prompt:].any()

    engine.synthesize("Hello there, my friend.", text_split_method="cut0", top_k=3, temperature=0.7, seed=9)
    p = spy.calls[-1]["params"]
    assert (p.top_k, p.temperature, spy.calls[-1]["seed"]) == (3, 0.7, 9)


def test_llm_text_stage_before_the_front_end(engine, monkeypatch):
    """PRIMESPEECH_LLM_TEXT (on by default): the GPT gets the phones of the prose, not of the reasoning and the
    markup; ``llm_text=False`` (what the node passes after its own stream filter) phonemises the text as given."""
    spy = GenerateSpy(monkeypatch)
    assert engine.settings.llm_text is True
    engine.synthesize("Hello there, my friend.", text_split_method="cut0")
    engine.synthesize("<think>The user says hi.</think>\n**Hello there**, my [friend](https://x.io).",
                      text_split_method="cut0")
    engine.synthesize("<think>The user says hi.</think>\n**Hello there**, my [friend](https://x.io).",
                      text_split_method="cut0", llm_text=False)
    plain, cleaned, *raw = (c["phones"] for c in spy.calls)
    np.testing.assert_array_equal(cleaned, plain)
    assert sum(r.shape[1] for r in raw) > plain.shape[1]  # the raw text's reasoning and URL are phonemised too
    with pytest.raises(ConfigError, match="llm_text"):
        engine.synthesize("Hello.", llm_text="yes")


# ---- requests -------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["。。。", "", "   \n", "!?", "…"])
def test_nothing_to_speak(engine, text):
    skipped = engine.stats()["skipped"]
    with pytest.raises(NothingToSpeakError):
        engine.synthesize(text)
    assert engine.stats()["skipped"] == skipped + 1


def test_bad_language_is_a_frontend_error(engine):
    with pytest.raises(UnsupportedLanguageError):
        engine.synthesize("Hello there.", text_lang="xx")
    with pytest.raises(TextFrontendError):
        engine.synthesize("。。。", text_lang="klingon")


def test_chunks_postprocessed_and_concatenated(engine, voice):
    """cut5 makes several chunks: each decoded alone (1280 samples per token at speed 1) and followed
    by fragment_interval of silence."""
    from dora_primespeech_mlx.text import preprocess

    text = "Hello world, this is a test. Another sentence follows here!"
    n_chunks = len(preprocess(text, voice.language, "cut5", data=DATA))  # the request's language: the voice's
    assert n_chunks >= 2
    r = engine.synthesize(text, text_split_method="cut5", speed_factor=1.0, fragment_interval=0.25, seed=3)
    gap = int(r.sample_rate * 0.25)
    assert len(r.audio) == 1280 * len(r.semantic_tokens) + n_chunks * gap
    assert r.audio.dtype == np.float32 and r.audio.ndim == 1
    assert np.abs(r.audio).max() <= 1.0
    assert not r.audio[-gap:].any()
    assert np.abs(r.audio[:-gap]).max() > 0.01


def test_speed_factor_default_comes_from_the_voice(engine, voice):
    fast = dataclasses.replace(voice, speed_factor=1.25)
    r = engine.synthesize("Hello there, my friend.", voice=fast, text_split_method="cut0", fragment_interval=0.0)
    t = len(r.semantic_tokens)
    assert len(r.audio) == (int(2 * t / 1.25) + 1) * 640  # (an explicit speed_factor: test_chunks_...)


def test_reference_cache_is_reused(model_dir, voice, monkeypatch):
    eng = GPTSoVITSEngine(model_dir=model_dir, config=FAST)
    calls = []
    real = eng.references.prompt_semantic
    monkeypatch.setattr(eng.references, "prompt_semantic", lambda *a: calls.append(1) or real(*a))
    first = eng.synthesize("Hello there, my friend.", voice=voice)
    second = eng.synthesize("Hello again, my friend.", voice=voice)
    assert len(calls) == 1
    assert eng.stats()["reference_computations"] == 1
    assert "reference" in first.timings and "reference" not in second.timings
    # a different prompt text is a different reference side
    eng.load_voice(dataclasses.replace(voice, prompt_text="Another prompt here"))
    assert len(calls) == 2 and eng.stats()["reference_computations"] == 2


def test_reference_free_mode(model_dir, voice, monkeypatch):
    """An empty prompt text: no HuBERT prompt, the GPT sees only the target phones."""
    spy = GenerateSpy(monkeypatch)
    eng = GPTSoVITSEngine(model_dir=model_dir, config=FAST)
    free = dataclasses.replace(voice, prompt_text="")
    r = eng.synthesize("Hello there, my friend.", voice=free, text_split_method="cut0")
    ref = _reference(eng)
    assert ref.prompt_semantic is None and ref.prompt_phones is None
    (call,) = spy.calls
    assert call["prompt"] is None
    assert len(r.semantic_tokens) > 0 and len(r.audio) > 0


@pytest.mark.parametrize("seconds", [2.0, 11.0])
def test_reference_must_be_3_to_10_seconds(model_dir, voice, tmp_path, seconds):
    wav, sr = sf.read(str(voice.reference), dtype="float32")
    n = int(seconds * sr)
    clip = np.resize(wav, n)
    path = tmp_path / f"ref_{seconds}.wav"
    sf.write(str(path), clip, sr)
    eng = GPTSoVITSEngine(model_dir=model_dir, config=FAST)
    with pytest.raises(ConfigError, match=r"3-10 s"):
        eng.load_voice(dataclasses.replace(voice, reference=path))


def test_english_needs_no_bert_chinese_needs_a_1024_wide_one(model_dir, voice):
    """An English voice (English prompt) never loads the BERT for English text; Chinese text loads it and
    is spoken when the fixture BERT is 1024 wide (the GPT's bert_proj input), else fails clearly."""
    english = dataclasses.replace(voice, language="en", prompt_lang="en", prompt_text="Good morning, this is my voice.")
    eng = GPTSoVITSEngine(model_dir=model_dir, config=FAST)
    eng.synthesize("Hello there, my friend.", voice=english)
    assert not any(m.startswith("bert:") for m in eng.stats()["loaded_models"])
    if bert_width(voice) == 1024:
        r = eng.synthesize("你好，欢迎使用语音合成系统。", voice=english, text_lang="zh")
        assert len(r.semantic_tokens) > 0 and len(r.audio) > 0
        assert any(m.startswith("bert:") for m in eng.stats()["loaded_models"])
        return
    with pytest.raises(SynthesisError, match="1024") as err:
        eng.synthesize("你好，欢迎使用语音合成系统。", voice=english, text_lang="zh")
    assert err.value.stage == "bert"


def test_chinese_segments_get_bert_features_in_one_batch(engine, voice):
    """zh segments: BERT features of their norm_text repeated by word2ph; other segments zeros; all
    chunks' zh segments in one BERT call. Uses a random 1024-wide BERT with the fixture tokenizer."""
    import mlx.core as mx

    from dora_primespeech_mlx.engine.encoders import EncoderBackends
    from dora_primespeech_mlx.models.bert.model import BertArgs, BertModel, BertTokenizer, bert_features
    from dora_primespeech_mlx.text import preprocess

    tokenizer = BertTokenizer.from_dir(voice.bert)
    mx.random.seed(0)
    model = BertModel(
        BertArgs(vocab_size=200, hidden_size=1024, num_hidden_layers=3, num_attention_heads=4,
                 intermediate_size=64, max_position_embeddings=128)
    )
    calls = []

    class Counting:
        args = model.args

        def __call__(self, *a, **kw):
            calls.append(1)
            return model(*a, **kw)

    encoders = EncoderBackends(mode="mlx", mlx_bert=lambda: (Counting(), tokenizer))
    chunks = preprocess("你好world，再见。好的", "zh", "cut5", data=DATA)
    assert len(chunks) >= 2
    feats = pipeline.bert_features(chunks, voice, encoders)
    assert len(calls) == 1
    for chunk, f in zip(chunks, feats):
        assert f.shape == (1024, len(chunk.phone_ids))
        col = 0
        for seg in chunk.segments:
            part = f[:, col : col + len(seg.phone_ids)]
            if seg.lang == "zh":
                expected = bert_features(model, tokenizer, seg.norm_text, seg.word2ph)
                np.testing.assert_allclose(part, expected, atol=1e-4)
                assert np.abs(part).max() > 0
            else:
                assert not part.any()
            col += len(seg.phone_ids)
        assert col == f.shape[1]
    assert any(seg.lang == "en" for c in chunks for seg in c.segments)


# ---- engine services ------------------------------------------------------------------------------


def test_stats_warmup_and_voices(model_dir, voice):
    eng = GPTSoVITSEngine(model_dir=model_dir, config=FAST)
    with pytest.raises(ConfigError, match="no voice"):
        eng.synthesize("Hello.")
    eng.load_voice(voice)
    eng.warmup()
    st = eng.stats()
    # The call without a voice counts as a failed request; the warm-up is not a request.
    assert (st["requests"], st["failures"]) == (1, 1), "warmup is not a request"
    assert st["voice"] == voice.name and st["reference_computations"] == 1
    r = eng.synthesize("Hello there, my friend.")
    st = eng.stats()
    assert st["requests"] == 2 and st["tokens"] == len(r.semantic_tokens)
    assert st["audio_seconds"] == pytest.approx(r.duration)
    for stage in ("text", "gpt_prefill", "gpt_decode", "sovits", "total"):
        assert st["mean_timings"][stage] == pytest.approx(r.timings[stage])
    encoders = st["backends"]["encoders"]
    assert encoders["mode"] == "auto" and encoders["hubert"]["backend"] in ("mlx", "coreml")
    names = {v["name"] for v in eng.list_voices()}
    assert "Doubao" in names
    assert all({"name", "language", "installed", "source", "speed_factor"} <= set(v) for v in eng.list_voices())


def test_bad_engine_options():
    with pytest.raises(ConfigError, match="device"):
        GPTSoVITSEngine(device="tpu")
    with pytest.raises(ConfigError, match="encoders"):
        GPTSoVITSEngine(encoders="onnx")
    with pytest.raises(ConfigError, match="config"):
        GPTSoVITSEngine(config={"top_k": 3})


def test_seeded_results_and_threads(engine):
    """A seed fixes the sampled tokens and the SoVITS noise; two threads at once get the same results
    as one after the other (one lock around the models); another seed gives other results."""
    kw = {"seed": 5, "top_k": 20, "text_split_method": "cut0"}
    expected = engine.synthesize("Hello there, my friend.", **kw)
    results: list[SynthesisResult] = []
    errors: list[BaseException] = []

    def run():
        try:
            results.append(engine.synthesize("Hello there, my friend.", **kw))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 2
    for r in results:
        np.testing.assert_array_equal(r.semantic_tokens, expected.semantic_tokens)
        np.testing.assert_array_equal(r.audio, expected.audio)
    other = engine.synthesize("Hello there, my friend.", **{**kw, "seed": 6})
    assert len(other.audio) != len(expected.audio) or not np.array_equal(other.audio, expected.audio)


def test_switching_voices_and_cleanup(model_dir, voice, tmp_path):
    """A second voice with its own GPT file: switching frees the first voice's GPT; cleanup drops the
    other voice's reference features."""
    import shutil

    gpt_copy = tmp_path / "other-gpt.ckpt"
    shutil.copy(voice.gpt, gpt_copy)
    other = dataclasses.replace(voice, name="other", gpt=gpt_copy)
    eng = GPTSoVITSEngine(model_dir=model_dir, config=FAST)
    eng.load_voice(voice)
    eng.load_voice(other)
    gpts = [m for m in eng.stats()["loaded_models"] if m.startswith("gpt:")]
    assert gpts == ["gpt:other-gpt.ckpt"]
    assert eng.stats()["cached_references"] == 2
    freed = eng.cleanup()
    assert freed["references"] == 1 and eng.stats()["cached_references"] == 1
    assert eng.synthesize("Hello there, my friend.").voice == "other"


@pytest.mark.skipif(__import__("sys").platform == "darwin", reason="off macOS CoreML must fall back")
def test_coreml_encoders_fall_back_to_mlx_off_macos(model_dir, voice):
    eng = GPTSoVITSEngine(model_dir=model_dir, encoders="coreml", config=FAST)
    eng.load_voice(voice)
    hubert = eng.stats()["backends"]["encoders"]["hubert"]
    assert hubert["backend"] == "mlx" and hubert["fallback"]
    got = eng.synthesize("Hello there, my friend.")
    # Synthesis after the fallback equals the plain MLX path, token for token and sample for sample.
    ref = GPTSoVITSEngine(model_dir=model_dir, encoders="mlx", config=FAST)
    ref.load_voice(voice)
    want = ref.synthesize("Hello there, my friend.")
    np.testing.assert_array_equal(got.semantic_tokens, want.semantic_tokens)
    np.testing.assert_array_equal(got.audio, want.audio)
