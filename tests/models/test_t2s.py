"""GPT text-to-semantic model against the golden data of the original GPT-SoVITS (models/cases.json).

Every case whose name starts with "gpt", plus the GPT part of the "e2e" case, is checked with what its
arrays hold: ``xy_pos`` / first-step ``logits``, per-step raw logits (teacher-forced on the recorded
tokens and along our own decode), exact tokens and stop index. Sampling parameters and tolerances come
from the case. Run with ``-s`` to see the max errors next to their tolerances.
"""

from __future__ import annotations

import itertools

import mlx.core as mx
import numpy as np
import pytest
from conftest import load_cases_json, model_cases, param_or_missing, require_case, require_fixture

from dora_primespeech_mlx.convert.checkpoints import read_gpt
from dora_primespeech_mlx.convert.load import from_checkpoint
from dora_primespeech_mlx.models.gpt.decode import make_decoder
from dora_primespeech_mlx.models.gpt.generate import SamplingParams, generate, generate_all
from dora_primespeech_mlx.models.gpt.kv_cache import CACHE_STEP
from dora_primespeech_mlx.models.gpt.model import T2SArgs, T2SModel, sine_table

CASES = model_cases("gpt") + model_cases("e2e")
CASE_PARAMS = param_or_missing(CASES, lambda c: c["name"], "models/cases.json gpt cases")

# Array names used by the cases for the same quantity (gpt_* cases / e2e case).
PHONES = ("phones", "all_phones")
BERT = ("bert_features", "all_bert_features")
PROMPT = ("prompt_semantic",)
TOKENS = ("tokens", "semantic_tokens")
STEP_LOGITS = ("step_logits", "gpt_step_logits")
STOPPED = ("stopped_at_idx", "gpt_stopped_at_idx")


def _gpt_checkpoint_rel() -> str:
    cases = load_cases_json()
    if not cases:
        require_fixture("models/cases.json")
    return "models/" + cases["checkpoints"]["gpt"]


@pytest.fixture(scope="module")
def raw_gpt():
    return read_gpt(require_fixture(_gpt_checkpoint_rel()))


@pytest.fixture(scope="module")
def model(raw_gpt):
    return from_checkpoint(raw_gpt)  # the product's loader; decoder "auto" (numpy on the CPU, MLX on a GPU)


def _first(d, names, what):
    for n in names:
        if n in d.files:
            return d[n]
    pytest.skip(f"case holds no {what} ({' / '.join(names)})")
    return None


def _has(d, names) -> bool:
    return any(n in d.files for n in names)


def _load(case):
    case = require_case(case, "models/cases.json")
    return case, np.load(require_fixture("models/" + case["file"]))


def _inputs(d):
    phones = np.asarray(_first(d, PHONES, "phones")).reshape(1, -1)
    bert = np.asarray(_first(d, BERT, "bert features"), dtype=np.float32)
    bert = bert.reshape(1, bert.shape[-2], bert.shape[-1])
    prompt = np.asarray(_first(d, PROMPT, "prompt semantic tokens")).reshape(1, -1)
    return phones, bert, prompt


def _tolerance(case, names):
    """The case's own tolerance for one of ``names``; else the per-step logits tolerance recorded by
    another GPT case (the README gives one per-step tolerance for all GPT logits); else None."""
    tol = case.get("tolerance", {})
    for n in names:
        if isinstance(tol.get(n), dict):
            return tol[n], case["name"]
    for other in model_cases("gpt"):
        t = other.get("tolerance", {}).get("step_logits")
        if isinstance(t, dict):
            return t, other["name"]
    return None, None


def _check_close(case, what, actual, golden, tol, source):
    actual = np.asarray(actual, dtype=np.float64)
    golden = np.asarray(golden, dtype=np.float64)
    assert actual.shape == golden.shape, f"{case['name']} {what}: shape {actual.shape} vs golden {golden.shape}"
    err = float(np.max(np.abs(actual - golden))) if actual.size else 0.0
    atol, rtol = float(tol.get("atol", 0.0)), float(tol.get("rtol", 0.0))
    print(f"\n[t2s] {case['name']:<16} {what:<28} max_abs_err={err:.3e}  tol atol={atol:g} rtol={rtol:g} ({source})")
    np.testing.assert_allclose(actual, golden, atol=atol, rtol=rtol, err_msg=f"{case['name']} {what}")


def _sampling(case, model) -> tuple[SamplingParams, int]:
    p = case.get("params") or case.get("inputs") or {}
    params = SamplingParams(
        top_k=p.get("top_k", SamplingParams.top_k),
        top_p=float(p.get("top_p", SamplingParams.top_p)),
        temperature=float(p.get("temperature", SamplingParams.temperature)),
        repetition_penalty=float(p.get("repetition_penalty", SamplingParams.repetition_penalty)),
    )
    esn = p.get("early_stop_num", case.get("early_stop_num"))
    return params, int(model.args.early_stop_num if esn is None else esn)


def _recorded_noise(d):
    """Replay ``exp_noise_first11`` (EOS-masked steps) then ``exp_noise_rest``; None when not recorded."""
    if "exp_noise_first11" not in d.files:
        return None
    first, rest = d["exp_noise_first11"], d["exp_noise_rest"]

    def noise(step, width):
        q = first[step] if step < first.shape[0] else rest[step - first.shape[0]]
        assert q.shape == (width,), f"recorded noise row {step} has width {q.shape}, decoder asks {width}"
        return q

    return noise


# ---- golden cases -------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_t2s_prefix(case, model):
    case, d = _load(case)
    if not _has(d, ("xy_pos", "logits")):
        pytest.skip(f"{case['name']} holds no first-step arrays (xy_pos / logits)")
    phones, bert, prompt = _inputs(d)
    if "xy_pos" in d.files:
        xy = model.embed_prefix(mx.array(phones.astype(np.int32)), mx.array(bert), mx.array(prompt.astype(np.int32)))
        tol, src = _tolerance(case, ("xy_pos",))
        _check_close(case, "xy_pos", np.array(xy), d["xy_pos"], tol, src)
    if "logits" in d.files:
        cache = model.make_cache()
        logits = model.prefill(mx.array(phones), mx.array(bert), mx.array(prompt), cache)
        assert cache.offset == phones.shape[1] + prompt.shape[1]
        tol, src = _tolerance(case, ("logits",))
        _check_close(case, "first-step logits", np.array(logits), d["logits"], tol, src)


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_t2s_teacher_forced_logits(case, model):
    """Raw logits of every step when the recorded tokens are fed back (independent of sampling)."""
    case, d = _load(case)
    golden = _first(d, STEP_LOGITS, "per-step logits")
    tokens = _first(d, TOKENS, "tokens")
    phones, bert, prompt = _inputs(d)
    assert golden.shape[0] <= tokens.shape[0] + 1
    cache = model.make_cache(step=max(8, CACHE_STEP // 16))  # several bucket growths
    rows = [np.array(model.prefill(mx.array(phones), mx.array(bert), mx.array(prompt), cache)[0])]
    for k in range(golden.shape[0] - 1):
        rows.append(np.array(model.step(int(tokens[k]), prompt.shape[1] + k, cache)[0]))
    tol, src = _tolerance(case, STEP_LOGITS)
    if tol is None:
        pytest.skip("no logits tolerance recorded in cases.json")
    _check_close(case, f"teacher-forced logits x{len(rows)}", np.stack(rows), golden, tol, src)


@pytest.mark.parametrize("cache_step", [CACHE_STEP, 16], ids=["cache-default", "cache-16"])
@pytest.mark.parametrize("case", CASE_PARAMS)
def test_t2s_generation(case, cache_step, model):
    """Our own decode: exact tokens, stop index and every step's raw logits."""
    case, d = _load(case)
    golden_tokens = _first(d, TOKENS, "tokens")
    phones, bert, prompt = _inputs(d)
    params, early_stop_num = _sampling(case, model)
    noise = _recorded_noise(d)
    if noise is None and params.top_k != 1:
        pytest.skip(f"{case['name']}: sampled without recorded noise; only distributional parity")
    result = generate_all(
        model, phones, bert, prompt, params, early_stop_num,
        noise=noise, seed=0, return_logits=True, decoder=make_decoder(model, cache_step=cache_step),
    )  # fmt: skip
    stopped = next((case[k] for k in STOPPED if k in case), len(golden_tokens))
    print(
        f"\n[t2s] {case['name']:<16} tokens {len(result.tokens)}/{len(golden_tokens)} "
        f"stop {result.stopped_at_idx} ({result.stop_reason}) vs {stopped}"
    )
    np.testing.assert_array_equal(result.tokens, golden_tokens.astype(np.int64), err_msg=f"{case['name']} tokens")
    assert result.stopped_at_idx == stopped
    assert result.stopped_at_idx == len(result.tokens)
    if _has(d, STEP_LOGITS):
        tol, src = _tolerance(case, STEP_LOGITS)
        if tol is not None:
            golden = _first(d, STEP_LOGITS, "per-step logits")
            _check_close(case, f"decode logits x{len(golden)}", result.step_logits, golden, tol, src)


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_t2s_generate_streams_and_cancels(case, model):
    """The iterator yields the same tokens as generate_all, and stopping early is just closing it."""
    case, d = _load(case)
    golden_tokens = _first(d, TOKENS, "tokens")
    phones, bert, prompt = _inputs(d)
    params, early_stop_num = _sampling(case, model)
    noise = _recorded_noise(d)
    if noise is None and params.top_k != 1:
        pytest.skip(f"{case['name']}: sampled without recorded noise")
    streamed = list(generate(model, phones, bert, prompt, params, early_stop_num, noise=noise, seed=0))
    assert streamed == golden_tokens.tolist()
    it = generate(model, phones, bert, prompt, params, early_stop_num, noise=_recorded_noise(d), seed=0)
    head = list(itertools.islice(it, 3))
    it.close()
    assert head == golden_tokens[:3].tolist()


# ---- rules that do not need golden arrays (but use the fixture model) ----------------------------


def _first_gpt_inputs():
    for case in model_cases("gpt"):
        d = np.load(require_fixture("models/" + case["file"]))
        if _has(d, PHONES) and _has(d, PROMPT):
            return _inputs(d)
    pytest.skip("no GPT case with inputs")
    return None


def test_t2s_eos_masked_for_first_11_steps(model):
    """Noise that makes EOS win whenever it is a candidate: EOS can only end decoding at step 11, and
    the EOS itself is not returned."""
    phones, bert, prompt = _first_gpt_inputs()
    eos = model.args.eos

    def noise(step, width):
        q = np.ones(width, dtype=np.float32)
        if width > eos:
            q[eos] = 1e-30
        return q

    params = SamplingParams(top_k=None, top_p=1.0, temperature=1.0, repetition_penalty=1.35)
    r = generate_all(model, phones, bert, prompt, params, early_stop_num=-1, noise=noise)
    assert (r.stop_reason, r.stopped_at_idx, len(r.tokens)) == ("eos", 11, 11)
    assert eos not in r.tokens


def test_t2s_early_stop_and_step_cap(model):
    phones, bert, prompt = _first_gpt_inputs()
    greedy = SamplingParams(top_k=1, top_p=1.0, temperature=1.0, repetition_penalty=1.35)
    r0 = generate_all(model, phones, bert, prompt, greedy, early_stop_num=0)
    assert (r0.stop_reason, r0.stopped_at_idx, len(r0.tokens)) == ("early_stop", 0, 0)
    r5 = generate_all(model, phones, bert, prompt, greedy, early_stop_num=5, return_logits=True)
    assert (r5.stop_reason, len(r5.tokens), r5.step_logits.shape[0]) == ("early_stop", 5, 6)
    cap = generate_all(model, phones, bert, prompt, greedy, early_stop_num=-1, max_steps=8)
    assert (cap.stop_reason, cap.stopped_at_idx, len(cap.tokens)) == ("max_steps", 7, 7)
    np.testing.assert_array_equal(cap.tokens[:5], r5.tokens)


def test_t2s_prompt_free_follows_the_naive_loop(model, monkeypatch):
    """Without a prompt upstream decodes with infer_panel_naive: an early stop and the step cap keep the token
    of the stopping step, EOS is still dropped, and the repetition penalty is always its default 1.35."""
    import dora_primespeech_mlx.models.gpt.generate as t2s_generate

    phones, bert, _ = _first_gpt_inputs()
    greedy = SamplingParams(top_k=1, top_p=1.0, temperature=1.0, repetition_penalty=1.35)
    r5 = generate_all(model, phones, bert, None, greedy, early_stop_num=5, return_logits=True)
    assert (r5.stop_reason, r5.stopped_at_idx, len(r5.tokens), r5.step_logits.shape[0]) == ("early_stop", 5, 6, 6)
    assert list(generate(model, phones, bert, None, greedy, 5)) == r5.tokens.tolist()
    r0 = generate_all(model, phones, bert, None, greedy, early_stop_num=0)
    assert (r0.stop_reason, r0.stopped_at_idx, len(r0.tokens)) == ("early_stop", 0, 1)
    cap = generate_all(model, phones, bert, None, greedy, early_stop_num=-1, max_steps=8)
    assert (cap.stop_reason, cap.stopped_at_idx, len(cap.tokens)) == ("max_steps", 7, 8)
    np.testing.assert_array_equal(cap.tokens[:6], r5.tokens)

    eos = model.args.eos

    def eos_noise(step, width):
        q = np.ones(width, dtype=np.float32)
        if width > eos:
            q[eos] = 1e-30
        return q

    sampled = SamplingParams(top_k=None, top_p=1.0, temperature=1.0, repetition_penalty=1.35)
    r = generate_all(model, phones, bert, None, sampled, early_stop_num=-1, noise=eos_noise)
    assert (r.stop_reason, r.stopped_at_idx, len(r.tokens)) == ("eos", 11, 11) and eos not in r.tokens

    def run(penalty):
        params = SamplingParams(top_k=1, top_p=1.0, temperature=1.0, repetition_penalty=penalty)
        return generate_all(model, phones, bert, None, params, early_stop_num=40).tokens

    ours = run(1.35)
    np.testing.assert_array_equal(run(1.0), ours)  # the caller's value is not used
    monkeypatch.setattr(t2s_generate, "NAIVE_REPETITION_PENALTY", 1.0)
    assert not np.array_equal(run(1.35), ours), "the naive loop's own penalty decides the tokens"


def test_t2s_default_noise_is_seeded(model):
    phones, bert, prompt = _first_gpt_inputs()
    params = SamplingParams(top_k=15, top_p=1.0, temperature=1.0, repetition_penalty=1.35)
    a = generate_all(model, phones, bert, prompt, params, early_stop_num=20, seed=233333)
    b = generate_all(model, phones, bert, prompt, params, early_stop_num=20, seed=233333)
    np.testing.assert_array_equal(a.tokens, b.tokens)


def test_t2s_config_and_sanitize(raw_gpt):
    args = T2SArgs.from_config(raw_gpt.config)
    m = raw_gpt.config["model"]
    assert (args.hidden_dim, args.num_heads, args.num_layers) == (m["hidden_dim"], m["head"], m["n_layer"])
    assert args.early_stop_num == int(50 * raw_gpt.config["data"]["max_sec"])
    assert T2SArgs(**args.to_dict()) == args
    weights = T2SModel.sanitize(raw_gpt.weights)
    assert all(v.dtype == np.float32 for v in weights.values())
    assert not any(k.startswith("model.") for k in weights)
    assert len(weights) == len(raw_gpt.weights)
    with pytest.raises(ValueError, match="max_sec"):
        T2SArgs.from_config({"model": raw_gpt.config["model"]})


@pytest.mark.parametrize("max_sec", [0, -1, float("nan"), float("inf"), 601, 1e30, "54", True, [54]])
def test_t2s_config_refuses_a_max_sec_that_would_not_bound_the_decode(raw_gpt, max_sec):
    """data.max_sec sets how many tokens a GPT may decode without EOS (50 per second): a checkpoint's config must
    not make that unbounded, negative or a string (50 * "54" would be a 100-digit token count)."""
    config = {**raw_gpt.config, "data": {**(raw_gpt.config.get("data") or {}), "max_sec": max_sec}}
    with pytest.raises(ValueError, match="max_sec"):
        T2SArgs.from_config(config)


@pytest.mark.parametrize("max_sec", [54, 54.0, 0.5, 600])
def test_t2s_config_accepts_a_max_sec_in_range(raw_gpt, max_sec):
    config = {**raw_gpt.config, "data": {**(raw_gpt.config.get("data") or {}), "max_sec": max_sec}}
    assert T2SArgs.from_config(config).early_stop_num == int(50 * max_sec)


def test_t2s_v1_phoneme_vocab(raw_gpt):
    """v1 checkpoints have a 512-row phoneme embedding; everything else is the same."""
    config = {**raw_gpt.config, "model": {**raw_gpt.config["model"], "phoneme_vocab_size": 512}}
    weights = dict(raw_gpt.weights)
    key = "model.ar_text_embedding.word_embeddings.weight"
    weights[key] = weights[key][:512]
    raw = type(raw_gpt)(raw_gpt.path, "gpt", weights, config, "v1")
    m = from_checkpoint(raw)
    assert m.text_embedding.weight.shape[0] == 512
    with pytest.raises(ValueError, match="phone ids"):
        generate_all(m, np.array([[600]]), np.zeros((1, 1024, 1)), np.array([[1]]), SamplingParams(), 3)
    with pytest.raises(ValueError, match="bert features"):  # checked at the call, before iterating
        generate(m, np.array([[5, 7, 9]]), np.zeros((1, 1024, 2)), np.array([[1]]), SamplingParams(), 3)
    r = generate_all(m, np.array([[5, 7, 9]]), np.zeros((1, 1024, 3)), np.array([[1, 2]]), SamplingParams(), 3)
    assert len(r.tokens) == 3


# ---- sampling rules on synthetic logits ----------------------------------------------------------


def test_t2s_sine_table_interleaved():
    pe = sine_table(5, 8)
    p, i = 3, 2
    w = np.exp(-2 * i * np.log(10000.0) / 8)
    assert pe[p, 2 * i] == pytest.approx(np.sin(p * w), abs=1e-6)
    assert pe[p, 2 * i + 1] == pytest.approx(np.cos(p * w), abs=1e-6)


def test_t2s_sampling_rules():
    from dora_primespeech_mlx.models.gpt.generate import apply_repetition_penalty, logits_to_probs, sample_token

    seen = np.array([True, True, False, False])
    pen = apply_repetition_penalty(np.array([2.0, -2.0, 2.0, -2.0], np.float32), seen, 2.0)
    np.testing.assert_allclose(pen, [1.0, -4.0, 2.0, -2.0])
    # top-k keeps ties
    probs = logits_to_probs(np.array([3.0, 3.0, 1.0], np.float32), SamplingParams(top_k=1, top_p=1.0))
    np.testing.assert_allclose(probs, [0.5, 0.5, 0.0], atol=1e-7)
    # top-p always keeps the best token
    probs = logits_to_probs(np.array([1.0, 0.9, 0.8], np.float32), SamplingParams(top_k=None, top_p=1e-6))
    np.testing.assert_allclose(probs, [1.0, 0.0, 0.0])
    # temperature sharpens before softmax
    p1 = logits_to_probs(np.array([1.0, 0.0], np.float32), SamplingParams(top_k=None, temperature=1.0))
    p2 = logits_to_probs(np.array([1.0, 0.0], np.float32), SamplingParams(top_k=None, temperature=0.5))
    assert p2[0] > p1[0]
    # argmax(probs / q) samples from probs; greedy is the argmax of the penalised logits
    logits = np.log(np.array([0.2, 0.5, 0.3], np.float32))
    rng = np.random.default_rng(0)
    params = SamplingParams(top_k=None, repetition_penalty=1.0)
    none = np.zeros(3, bool)
    draws = [sample_token(logits, none, params, rng.standard_exponential(3).astype(np.float32)) for _ in range(4000)]
    freq = np.bincount([t for t, _ in draws], minlength=3) / len(draws)
    np.testing.assert_allclose(freq, [0.2, 0.5, 0.3], atol=0.03)
    assert {g for _, g in draws} == {1}


def test_t2s_zero_noise_never_picks_a_removed_token():
    """An Exp(1) draw of exactly 0.0 (about 1 in 10**7 float32 draws) must not pick a token that top-k removed
    (0/0 is NaN, and argmax takes NaN as the largest); on a kept token it wins (p/0 = inf, as in torch)."""
    from dora_primespeech_mlx.models.gpt.generate import sample_token

    logits = np.array([0.5, 3.0, 1.0, 2.0], np.float32)
    none = np.zeros(4, bool)
    top1 = SamplingParams(top_k=1, top_p=1.0, temperature=1.0, repetition_penalty=1.0)
    for zero_at in range(4):
        q = np.ones(4, np.float32)
        q[zero_at] = 0.0
        with np.errstate(all="raise"):
            assert sample_token(logits, none, top1, q) == (1, 1)
    top2 = SamplingParams(top_k=2, top_p=1.0, temperature=1.0, repetition_penalty=1.0)
    q = np.array([0.0, 50.0, 1.0, 0.0], np.float32)
    assert sample_token(logits, none, top2, q) == (3, 1)
