"""The numpy decode step (CPU fast path) computes what the MLX decode step computes.

Random small GPTs (no fixtures needed); the fixture-based parity of the whole decode loop, whichever
backend is active, is in tests/models/test_t2s.py.
"""

from __future__ import annotations  # noqa: I001  (the package must load before mlx)

import dora_primespeech_mlx  # noqa: F401  (preloads a fast BLAS)
import mlx.core as mx
import numpy as np
import pytest

from dora_primespeech_mlx.models.t2s import T2SArgs, T2SModel
from dora_primespeech_mlx.models.t2s_generate import (
    KVCache,
    SamplingParams,
    decode_backend,
    generate_all,
)
from dora_primespeech_mlx.models.t2s_numpy import NumpyDecoder


def _model(dim=64, heads=4, layers=3, seed=0) -> T2SModel:
    mx.random.seed(seed)
    model = T2SModel(T2SArgs(hidden_dim=dim, embedding_dim=dim, num_heads=heads, num_layers=layers, max_sec=54))
    # non-trivial position scales and LayerNorm affine parameters
    model.text_position.alpha = mx.array([0.7])
    model.audio_position.alpha = mx.array([1.3])
    for b in model.layers:
        b.norm1.weight = mx.random.uniform(0.5, 1.5, b.norm1.weight.shape)
        b.norm2.bias = mx.random.normal(b.norm2.bias.shape) * 0.1
    mx.eval(model.parameters())
    return model


def _inputs(model, n_phones=9, n_prompt=7, seed=1):
    rng = np.random.default_rng(seed)
    phones = rng.integers(0, model.args.phoneme_vocab_size, (1, n_phones)).astype(np.int32)
    bert = rng.standard_normal((1, 1024, n_phones)).astype(np.float32)
    prompt = rng.integers(0, 1024, (1, n_prompt)).astype(np.int32)
    return phones, bert, prompt


@pytest.mark.parametrize("dims", [(64, 4, 3), (96, 6, 2)], ids=["d64h4", "d96h6"])
def test_numpy_step_matches_mlx_step(dims):
    model = _model(*dims)
    phones, bert, prompt = _inputs(model)
    mlx_cache = KVCache.for_model(model, step=8)  # grows several times below
    first = model.prefill(mx.array(phones), mx.array(bert), mx.array(prompt), mlx_cache)
    np_cache = KVCache.for_model(model, step=8)
    model.prefill(mx.array(phones), mx.array(bert), mx.array(prompt), np_cache)
    state = NumpyDecoder.for_model(model).start(model, np_cache, 40)
    rng = np.random.default_rng(2)
    tokens = rng.integers(0, 1024, 40)
    worst = 0.0
    for k, tok in enumerate(tokens):
        ref = np.array(model.step(int(tok), prompt.shape[1] + k, mlx_cache)[0])
        got = state.step(int(tok), prompt.shape[1] + k)
        assert got.shape == ref.shape == (model.args.vocab_size,)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4, err_msg=f"step {k}")
        worst = max(worst, float(np.abs(got - ref).max()))
    assert np.isfinite(np.array(first)).all()
    print(f"numpy vs MLX decode step: max abs diff {worst:.2e} over {len(tokens)} steps")


def test_numpy_state_refuses_overflow():
    model = _model()
    phones, bert, prompt = _inputs(model)
    cache = KVCache.for_model(model)
    model.prefill(mx.array(phones), mx.array(bert), mx.array(prompt), cache)
    state = NumpyDecoder.for_model(model).start(model, cache, 2)
    state.step(1, prompt.shape[1])
    state.step(2, prompt.shape[1] + 1)
    with pytest.raises(RuntimeError, match="full"):
        state.step(3, prompt.shape[1] + 2)


def test_decoder_views_follow_new_weights():
    model = _model()
    dec = NumpyDecoder.for_model(model)
    assert NumpyDecoder.for_model(model) is dec
    model.predict.weight = model.predict.weight * 2
    mx.eval(model.parameters())
    dec2 = NumpyDecoder.for_model(model)
    assert dec2 is not dec
    np.testing.assert_array_equal(dec2.predict, np.array(model.predict.weight))


def test_backends_generate_the_same_tokens():
    model = _model(seed=3)
    phones, bert, prompt = _inputs(model, seed=4)
    params = SamplingParams(top_k=5, top_p=1.0, temperature=1.0, repetition_penalty=1.35)
    runs = {
        b: generate_all(model, phones, bert, prompt, params, early_stop_num=30, seed=7, backend=b, return_logits=True)
        for b in ("mlx", "numpy")
    }
    assert runs["mlx"].tokens.tolist() == runs["numpy"].tokens.tolist()
    assert runs["mlx"].stop_reason == runs["numpy"].stop_reason
    np.testing.assert_allclose(runs["numpy"].step_logits, runs["mlx"].step_logits, rtol=1e-4, atol=1e-4)


def test_backend_choice(monkeypatch):
    monkeypatch.delenv("PRIMESPEECH_T2S_DECODE", raising=False)
    assert decode_backend() == ("numpy" if mx.default_device().type == mx.cpu else "mlx")
    assert decode_backend("mlx") == "mlx"
    monkeypatch.setenv("PRIMESPEECH_T2S_DECODE", "numpy")
    assert decode_backend() == "numpy"
    with pytest.raises(ValueError, match="decode backend"):
        decode_backend("torch")


def test_compiled_decode_matches_eager(monkeypatch):
    """The mx.compile'd MLX step (GPU default) gives the eager step's logits, across KV buckets."""
    model = _model(seed=5)
    phones, bert, prompt = _inputs(model, seed=6)
    caches = [KVCache.for_model(model, step=8) for _ in range(2)]
    for c in caches:
        model.prefill(mx.array(phones), mx.array(bert), mx.array(prompt), c)
    for k, tok in enumerate(np.random.default_rng(3).integers(0, 1024, 20)):
        pos = prompt.shape[1] + k
        eager = np.array(model.step(int(tok), pos, caches[0]))
        comp = np.array(model.step(int(tok), pos, caches[1], compiled=True))
        np.testing.assert_allclose(comp, eager, rtol=1e-5, atol=1e-5, err_msg=f"step {k}")
    monkeypatch.setenv("PRIMESPEECH_T2S_DECODE", "mlx")
    monkeypatch.setenv("PRIMESPEECH_T2S_COMPILE", "1")
    params = SamplingParams(top_k=5)
    a = generate_all(model, phones, bert, prompt, params, early_stop_num=12, seed=1)
    monkeypatch.setenv("PRIMESPEECH_T2S_COMPILE", "0")
    b = generate_all(model, phones, bert, prompt, params, early_stop_num=12, seed=1)
    assert a.tokens.tolist() == b.tokens.tolist()


def test_warmup_runs_for_each_backend(monkeypatch):
    from dora_primespeech_mlx.models.t2s_generate import warmup

    model = _model(seed=8)
    monkeypatch.setenv("PRIMESPEECH_T2S_DECODE", "numpy")
    warmup(model)
    assert getattr(model, "_numpy_decoder", None) is not None
    monkeypatch.setenv("PRIMESPEECH_T2S_DECODE", "mlx")
    monkeypatch.setenv("PRIMESPEECH_T2S_COMPILE", "1")
    warmup(model, prefix_rows=8, cache_step=8)
    assert getattr(model, "_compiled", None) is not None
