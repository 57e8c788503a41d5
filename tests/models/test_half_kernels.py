"""The float16-weight kernels (models/kernels/half_gemv.py) on several threads, the GPT prefill and decode through them
(models/gpt/numpy_decoder.py) and RoBERTa with float16 weights (models/bert/numpy_encoder.py, ``BertModel.prepare``).

- gemv: every row bit-identical whatever the thread count (rows are split, never a row's sum);
- the decode step's fused FFN: bit-identical to the separate calls it replaces;
- small-M GEMM: against a float64 product of the same float16 weights, with tails in M, N and K, bias, ReLU and
  exact GELU, and bit-identical across thread counts (columns are split);
- the GPT decode step at 2 threads bit-identical to 1 thread; the prefill through the GEMM close to the float32
  upcast + BLAS prefill; the prefill's attention and residual norms in the library close to numpy's;
- RoBERTa: the automatic choice (float16 + numpy where the kernels build on the CPU, float32 when the weights are
  not float16 values) and the fixture cases (tests/models/test_bert.py checks every case's goldens with both).
"""

from __future__ import annotations  # noqa: I001  (the package must load before mlx)

import math

import dora_primespeech_mlx  # noqa: F401  (preloads a fast BLAS)
import mlx.core as mx
import numpy as np
import pytest

from dora_primespeech_mlx.models.kernels import half_gemv
from dora_primespeech_mlx.runtime import Runtime


@pytest.fixture(scope="module")
def lib():
    k = half_gemv.library()
    if k is None:
        pytest.skip(f"float16 kernels unavailable here: {half_gemv.library_status()['why_not']}")
    return k


@pytest.fixture
def threads(lib):
    """Set the kernels' thread count for one test (``None``: the process default), restored afterwards."""
    saved = lib.nthreads

    def set_threads(n):
        lib.nthreads = half_gemv.threads if n is None else (lambda: n)
    yield set_threads
    lib.nthreads = saved


def _weights(rng, n, k):
    return (rng.standard_normal((n, k)) * 0.05).astype(np.float16)


@pytest.mark.parametrize("shape", [(1536, 512), (512, 2048), (1025, 512), (1000, 77), (7, 37)])
def test_gemv_rows_identical_on_any_thread_count(lib, threads, shape):
    rng = np.random.default_rng(sum(shape))
    w = _weights(rng, *shape)
    x = rng.standard_normal(shape[1]).astype(np.float32)
    b = rng.standard_normal(shape[0]).astype(np.float32)
    m = half_gemv.HalfMatrix(w, lib)
    threads(1)
    one = m.matvec(x, b)
    np.testing.assert_allclose(one, w.astype(np.float64) @ x + b, rtol=1e-5, atol=1e-5)
    for n in (2, 3, 4):
        threads(n)
        for _ in range(5):  # repeated: the workers race for the chunks differently each time
            np.testing.assert_array_equal(m.matvec(x, b), one)


def test_fused_ffn_equals_separate_calls(lib, threads):
    from dora_primespeech_mlx.models.gpt.numpy_decoder import _ffn

    rng = np.random.default_rng(3)
    d, f = 512, 2048

    class Layer:
        fc1_w = half_gemv.HalfMatrix(_weights(rng, f, d), lib)
        fc2_w = half_gemv.HalfMatrix(_weights(rng, d, f), lib)
        fc1_b = rng.standard_normal(f).astype(np.float32)

    x = rng.standard_normal(d).astype(np.float32)
    h = np.empty(f, np.float32)
    for n in (1, 2):
        threads(n)
        hh = Layer.fc1_w @ x + Layer.fc1_b  # what the step computed before the fused call
        np.maximum(hh, 0, out=hh)
        np.testing.assert_array_equal(_ffn(Layer, x, h), Layer.fc2_w @ hh)
        np.testing.assert_array_equal(h, hh)


def _gelu(y: np.ndarray) -> np.ndarray:
    erf = np.vectorize(math.erf)
    return 0.5 * y * (1.0 + erf(y / math.sqrt(2.0)))


@pytest.mark.parametrize("mnk", [(1, 7, 37), (5, 9, 16), (23, 1024, 1024), (23, 1027, 129), (210, 512, 512),
                                 (7, 64, 4096)])
@pytest.mark.parametrize("act", [None, "relu", "gelu"])
def test_gemm_matches_float64_and_threads_agree(lib, threads, mnk, act):
    M, N, K = mnk
    rng = np.random.default_rng(M * N + K)
    w = _weights(rng, N, K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    m = half_gemv.HalfMatrix(w, lib)
    ref = x.astype(np.float64) @ w.astype(np.float64).T + b
    ref = {None: ref, "relu": np.maximum(ref, 0), "gelu": _gelu(ref) if act == "gelu" else None}[act]
    threads(1)
    one = m.matmul_t(x, b, act)
    assert one.shape == (M, N) and one.dtype == np.float32
    np.testing.assert_allclose(one, ref, rtol=2e-5, atol=2e-5 * math.sqrt(K / 64))
    threads(2)
    for _ in range(3):
        np.testing.assert_array_equal(m.matmul_t(x, b, act), one)
    np.testing.assert_array_equal(m.matmul_t(x[None], b, act), one[None])  # leading dimensions
    with pytest.raises(ValueError):
        m.matmul_t(x[:, :-1])


def _gpt(layers: int = 2):
    from dora_primespeech_mlx.models.gpt.model import T2SArgs, T2SModel

    model = T2SModel(T2SArgs(num_layers=layers))  # real width (512, ffn 2048): the kernels run threaded
    mx.eval(model.parameters())
    for layer in model.layers:  # float16 values, as in the released checkpoints
        for lin in (layer.attn.qkv, layer.attn.out, layer.mlp.fc1, layer.mlp.fc2):
            lin.weight = lin.weight.astype(mx.float16).astype(mx.float32)
    model.predict.weight = model.predict.weight.astype(mx.float16).astype(mx.float32)
    return model


def test_gpt_decode_step_identical_at_two_threads_and_prefill_close_to_float32(lib, threads):
    from dora_primespeech_mlx.models.gpt.numpy_decoder import NumpyDecoder

    model = _gpt()
    dec = NumpyDecoder(model)
    assert dec.half
    ref = NumpyDecoder(model, half=False)  # float32 copies: upcast + BLAS prefill, numpy gemv steps
    rng = np.random.default_rng(0)
    phones = rng.integers(0, 700, (1, 40)).astype(np.int32)
    bert = (0.1 * rng.standard_normal((1, 1024, 40))).astype(np.float32)
    prompt = rng.integers(0, 1024, (1, 30)).astype(np.int32)
    threads(1)
    s1, l1 = dec.prefill(phones, bert, prompt, 20)
    s32, l32 = ref.prefill(phones, bert, prompt, 20)
    np.testing.assert_allclose(l1, l32, rtol=1e-4, atol=1e-4)
    threads(2)
    s2, l2 = dec.prefill(phones, bert, prompt, 20)
    np.testing.assert_array_equal(l2, l1)  # GEMM columns split across threads: same sums
    for i, tok in enumerate(rng.integers(0, 1024, 20)):
        threads(1)
        a = s1.step(int(tok), 30 + i)
        threads(2)
        np.testing.assert_array_equal(s2.step(int(tok), 30 + i), a)
        np.testing.assert_allclose(a, s32.step(int(tok), 30 + i), rtol=1e-4, atol=1e-4)


def _bert(float16_values: bool = True):
    from dora_primespeech_mlx.models.bert.model import BertArgs, BertModel

    args = BertArgs(vocab_size=300, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                    intermediate_size=1024, max_position_embeddings=64)
    model = BertModel(args)
    mx.eval(model.parameters())
    if float16_values:
        for _, m in model.named_modules():
            if hasattr(m, "weight") and m.weight.ndim == 2:
                m.weight = m.weight.astype(mx.float16).astype(mx.float32)
    return model


@pytest.mark.parametrize("path", ["auto", "float16", "float32"])
def test_bert_auto_uses_float16_kernels_on_the_cpu_and_matches_float32(lib, path):
    _bert_matches_float32(Runtime(bert_gemm=path))  # the numpy path's products: default, float16 GEMM, BLAS


def _bert_matches_float32(runtime):
    ids = mx.array(np.random.default_rng(1).integers(0, 300, (2, 17)).astype(np.int32))
    mask = np.ones((2, 17), np.int32)
    mask[1, 11:] = 0
    mask = mx.array(mask)
    ref_model = _bert()
    model = _bert()
    model.update(ref_model.parameters())
    ref_model.prepare(runtime.replace(bert_half=False))
    assert ref_model.fast_path() is None
    want = np.array(ref_model(ids, mask, output_hidden_states=True))
    model.prepare(runtime)  # auto
    if runtime.bert_gemm != "auto" and model.fast_path() is not None:
        assert model.fast_path().gemm == runtime.bert_gemm
    if mx.default_device().type != mx.cpu:
        assert model.fast_path() is None
        return
    assert model.fast_path() is not None
    layer = model.layers[0]
    assert layer.ffn.up.weight.dtype == mx.float16 and layer.attention.query.weight.dtype == mx.float16
    assert model.embeddings.word_embeddings.weight.dtype == mx.float16
    got = model(ids, mask, output_hidden_states=True)
    assert isinstance(got, list) and len(got) == len(want) and isinstance(got[-1], mx.array)
    np.testing.assert_allclose(np.array(got), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(np.array(model(ids, mask)), np.array(got[-1]))


def test_bert_auto_keeps_float32_weights_that_are_not_float16(lib):
    model = _bert(float16_values=False)
    model.prepare()
    assert model.fast_path() is None and model.layers[0].ffn.up.weight.dtype == mx.float32
    model.prepare(Runtime(bert_half=True))  # asked for: rounded to float16
    assert model.layers[0].ffn.up.weight.dtype == mx.float16
    assert (model.fast_path() is not None) == (mx.default_device().type == mx.cpu)


def test_bert_half_setting():
    from dora_primespeech_mlx.settings import Settings

    assert Settings.from_env({}).bert_half is None  # auto
    assert Settings.from_env({"PRIMESPEECH_BERT_HALF": "auto"}).bert_half is None
    assert Settings.from_env({"PRIMESPEECH_BERT_HALF": "1"}).bert_half is True
    assert Settings.from_env({"PRIMESPEECH_BERT_HALF": "0"}).bert_half is False


def test_fused_decode_step_matches_numpy_step(lib, threads):
    from dora_primespeech_mlx.models.gpt import numpy_decoder as t2s_numpy

    model = _gpt(layers=3)
    dec = t2s_numpy.NumpyDecoder(model)
    numpy_dec = t2s_numpy.NumpyDecoder(model, runtime=Runtime(fused_step=False))  # the same weights, numpy's step
    rng = np.random.default_rng(5)
    phones = rng.integers(0, 700, (1, 20)).astype(np.int32)
    bert = (0.1 * rng.standard_normal((1, 1024, 20))).astype(np.float32)
    prompt = rng.integers(0, 1024, (1, 10)).astype(np.int32)
    fused, _ = dec.prefill(phones, bert, prompt, 30)
    plain, _ = numpy_dec.prefill(phones, bert, prompt, 30)
    assert fused._fused is not None and fused.dec.fused and not plain.dec.fused
    worst = 0.0
    for n in (1, 2):
        threads(n)
        for i, tok in enumerate(rng.integers(0, 1024, 15)):
            a = fused.step(int(tok), 10 + 15 * (n - 1) + i)
            b = plain.step(int(tok), 10 + 15 * (n - 1) + i)
            worst = max(worst, float(np.abs(a - b).max()))
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(fused.keys[-1], plain.keys[-1], rtol=1e-5, atol=1e-5)
    print(f"\nfused vs numpy decode step: max |logit diff| {worst:.3g}")


@pytest.mark.parametrize("n_text,n_audio", [(37, 45), (5, 4), (70, 3)])
def test_prefill_attention_kernel_matches_numpy(lib, threads, n_text, n_audio):
    """The prefill's attention and residual norms in the kernel library against numpy: both mask shapes (text
    rows, audio rows), score tails of every length below a vector, and a prefix shorter than one vector."""
    from dora_primespeech_mlx.models.gpt import numpy_decoder as t2s_numpy

    model = _gpt(layers=2)
    dec = t2s_numpy.NumpyDecoder(model)
    rng = np.random.default_rng(9)
    phones = rng.integers(0, 700, (1, n_text)).astype(np.int32)
    bert = (0.1 * rng.standard_normal((1, 1024, n_text))).astype(np.float32)
    prompt = rng.integers(0, 1024, (1, n_audio)).astype(np.int32)
    ref, want = t2s_numpy.NumpyDecoder(model, runtime=Runtime(fused_step=False)).prefill(phones, bert, prompt, 4)
    for n in (1, 2):
        threads(n)
        got_state, got = dec.prefill(phones, bert, prompt, 4)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        for a, b in zip(got_state.keys + got_state.values, ref.keys + ref.values):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        assert got_state.offset == ref.offset == n_text + n_audio


@pytest.mark.parametrize("m,d", [(210, 512), (9, 1024), (1, 7), (33, 100)])
def test_add_layer_norm_rows_matches_numpy_on_any_thread_count(lib, threads, m, d):
    from dora_primespeech_mlx.models.gpt import numpy_decoder as t2s_numpy

    rng = np.random.default_rng(m + d)
    x, y = (3 * rng.standard_normal((2, m, d)) + 1).astype(np.float32)
    w, b = rng.standard_normal((2, d)).astype(np.float32)
    want = t2s_numpy._layer_norm_rows(x + y, w, b)
    threads(1)
    one = t2s_numpy._add_norm(x.copy(), y, w, b, lib)
    np.testing.assert_allclose(one, want, rtol=1e-5, atol=1e-5)
    for n in (2, 3):
        threads(n)
        np.testing.assert_array_equal(t2s_numpy._add_norm(x.copy(), y, w, b, lib), one)


def test_concurrent_callers_get_their_own_results(lib, threads):
    """Two Python threads in the kernels at once (ctypes releases the GIL; e.g. RoBERTa of the next sentence
    beside the GPT decode): one owns the pool, the other runs its chunks inline; both results exact."""
    import threading

    rng = np.random.default_rng(11)
    threads(2)
    a = half_gemv.HalfMatrix(_weights(rng, 1024, 512), lib)
    b = half_gemv.HalfMatrix(_weights(rng, 2048, 256), lib)
    xa = rng.standard_normal((23, 512)).astype(np.float32)
    xb = rng.standard_normal(256).astype(np.float32)
    want_a, want_b = a.matmul_t(xa), b.matvec(xb)
    errors = []

    def run(fn, want):
        try:
            for _ in range(200):
                np.testing.assert_array_equal(fn(), want)
        except AssertionError as exc:
            errors.append(exc)

    ts = [threading.Thread(target=run, args=(lambda: a.matmul_t(xa), want_a)),
          threading.Thread(target=run, args=(lambda: b.matvec(xb), want_b))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors[0]


def test_bert_auto_checks_the_word_embedding_too(lib):
    model = _bert()
    emb = model.embeddings.word_embeddings
    emb.weight = emb.weight + 1e-7 * (1 + mx.abs(emb.weight))  # the Linear weights are float16 values, this is not
    before = np.array(model.layers[0].ffn.up.weight)
    model.prepare()
    assert model.fast_path() is None
    assert emb.weight.dtype == mx.float32 and model.layers[0].ffn.up.weight.dtype == mx.float32  # put back
    np.testing.assert_array_equal(np.array(model.layers[0].ffn.up.weight), before)


@pytest.mark.parametrize("path", ["float16", "float32"])
def test_gpt_prefill_on_each_path_close_to_float32_model(lib, path):
    """The prefill's products on either path (cpu_paths: the float16 GEMM, or BLAS on each weight upcast into a
    scratch buffer) against the float32-weight decoder; the decode steps that follow agree as well."""
    from dora_primespeech_mlx.models.gpt.numpy_decoder import NumpyDecoder

    model = _gpt()
    dec, ref = NumpyDecoder(model, runtime=Runtime(gpt_prefill=path)), NumpyDecoder(model, half=False)
    assert dec.half and dec.weights().prefill_gemm == path
    rng = np.random.default_rng(7)
    phones = rng.integers(0, 700, (1, 33)).astype(np.int32)
    bert = (0.1 * rng.standard_normal((1, 1024, 33))).astype(np.float32)
    prompt = rng.integers(0, 1024, (1, 21)).astype(np.int32)
    s, logits = dec.prefill(phones, bert, prompt, 5)
    s32, l32 = ref.prefill(phones, bert, prompt, 5)
    np.testing.assert_allclose(logits, l32, rtol=1e-4, atol=1e-4)
    for i, tok in enumerate(rng.integers(0, 1024, 5)):
        np.testing.assert_allclose(s.step(int(tok), 21 + i), s32.step(int(tok), 21 + i), rtol=1e-4, atol=1e-4)
