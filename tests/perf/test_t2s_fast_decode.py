"""The three GPT decoders (numpy: the CPU fast path, eager MLX, compiled MLX) compute the same steps.

Random small GPTs (no fixtures needed); the fixture-based parity of the whole decode loop, whichever
backend is active, is in tests/models/test_t2s.py.
"""

from __future__ import annotations  # noqa: I001  (the package must load before mlx)

import dora_primespeech_mlx  # noqa: F401  (preloads a fast BLAS)
import mlx.core as mx
import numpy as np
import pytest

from dora_primespeech_mlx.models.gpt.model import T2SArgs, T2SModel
from dora_primespeech_mlx.models.gpt.decode import CompiledDecoder, MLXDecoder, decoder_kind, make_decoder
from dora_primespeech_mlx.models.gpt.generate import SamplingParams, generate_all
from dora_primespeech_mlx.models.gpt.numpy_decoder import NumpyDecoder
from dora_primespeech_mlx.runtime import Runtime


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
    mlx_session, mlx_first = MLXDecoder(model, cache_step=8).prefill(phones, bert, prompt, 40)  # grows below
    np_session, np_first = NumpyDecoder(model).prefill(phones, bert, prompt, 40)
    np.testing.assert_allclose(np_first, mlx_first, rtol=1e-4, atol=1e-4, err_msg="prefill")
    rng = np.random.default_rng(2)
    tokens = rng.integers(0, 1024, 40)
    worst = 0.0
    for k, tok in enumerate(tokens):
        ref = mlx_session.step(int(tok), prompt.shape[1] + k)
        got = np_session.step(int(tok), prompt.shape[1] + k)
        assert got.shape == ref.shape == (model.args.vocab_size,)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4, err_msg=f"step {k}")
        worst = max(worst, float(np.abs(got - ref).max()))
    print(f"numpy vs MLX decode step: max abs diff {worst:.2e} over {len(tokens)} steps")


def test_numpy_state_refuses_overflow():
    model = _model()
    phones, bert, prompt = _inputs(model)
    state, _ = NumpyDecoder(model).prefill(phones, bert, prompt, 2)
    state.step(1, prompt.shape[1])
    state.step(2, prompt.shape[1] + 1)
    with pytest.raises(RuntimeError, match="full"):
        state.step(3, prompt.shape[1] + 2)


def test_decoder_views_follow_new_weights():
    model = _model()
    dec = NumpyDecoder(model)
    views = dec.weights()
    assert dec.weights() is views
    model.predict.weight = model.predict.weight * 2
    mx.eval(model.parameters())
    assert dec.weights() is not views
    np.testing.assert_array_equal(dec.weights().predict, np.array(model.predict.weight))


def test_backends_generate_the_same_tokens():
    model = _model(seed=3)
    phones, bert, prompt = _inputs(model, seed=4)
    params = SamplingParams(top_k=5, top_p=1.0, temperature=1.0, repetition_penalty=1.35)
    runs = {
        kind: generate_all(
            model, phones, bert, prompt, params, early_stop_num=30, seed=7, return_logits=True,
            decoder=make_decoder(model, Runtime(t2s_decode=kind)),
        )
        for kind in ("mlx", "numpy")
    }  # fmt: skip
    assert runs["mlx"].tokens.tolist() == runs["numpy"].tokens.tolist()
    assert runs["mlx"].stop_reason == runs["numpy"].stop_reason
    np.testing.assert_allclose(runs["numpy"].step_logits, runs["mlx"].step_logits, rtol=1e-4, atol=1e-4)


def test_decoder_choice():
    on_cpu = mx.default_device().type == mx.cpu
    assert decoder_kind() == ("numpy" if on_cpu else "compile")
    assert decoder_kind("auto", compile_step=False) == ("numpy" if on_cpu else "mlx")
    assert decoder_kind("mlx") == ("mlx" if on_cpu else "compile")
    assert decoder_kind("mlx", compile_step=False) == "mlx"
    assert decoder_kind("MLX", compile_step=True) == "compile"
    assert decoder_kind("compile") == "compile"
    assert decoder_kind("numpy", compile_step=True) == "numpy"
    model = _model()
    kinds = {k: type(make_decoder(model, Runtime(t2s_decode=k, t2s_compile=False)))
             for k in ("mlx", "compile", "numpy")}
    assert kinds == {"mlx": MLXDecoder, "compile": CompiledDecoder, "numpy": NumpyDecoder}
    with pytest.raises(ValueError, match="decode backend"):
        decoder_kind("torch")


def test_generate_needs_a_decoder():
    model = _model()
    phones, bert, prompt = _inputs(model)
    with pytest.raises(ValueError, match="no decoder"):
        generate_all(model, phones, bert, prompt, SamplingParams(), early_stop_num=3)
    model.decoder = make_decoder(model, Runtime(t2s_decode="numpy"))
    assert len(generate_all(model, phones, bert, prompt, SamplingParams(), early_stop_num=3).tokens) == 3


def test_compiled_decode_matches_eager():
    """The mx.compile'd MLX step (GPU default) gives the eager step's logits, across KV buckets."""
    model = _model(seed=5)
    phones, bert, prompt = _inputs(model, seed=6)
    eager, _ = MLXDecoder(model, cache_step=8).prefill(phones, bert, prompt, 20)
    compiled, _ = CompiledDecoder(model, cache_step=8).prefill(phones, bert, prompt, 20)
    for k, tok in enumerate(np.random.default_rng(3).integers(0, 1024, 20)):
        pos = prompt.shape[1] + k
        a, b = eager.step(int(tok), pos), compiled.step(int(tok), pos)
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5, err_msg=f"step {k}")
    params = SamplingParams(top_k=5)
    runs = [
        generate_all(model, phones, bert, prompt, params, early_stop_num=12, seed=1,
                     decoder=make_decoder(model, Runtime(t2s_decode=k)))
        for k in ("compile", "mlx")
    ]
    assert runs[0].tokens.tolist() == runs[1].tokens.tolist()


def test_warmup_runs_for_each_decoder():
    model = _model(seed=8)
    numpy_dec = NumpyDecoder(model)
    numpy_dec.warmup()
    assert numpy_dec._weights is not None
    compiled = CompiledDecoder(model, cache_step=8)
    compiled.warmup(prefix_rows=8)
    assert compiled._compiled is not None
    MLXDecoder(model).warmup()  # nothing to build
