"""float16 GPT decode weights with float32 accumulation (models/kernels/half_gemv.py, t2s_numpy.half_weights).

The fixture GPT checkpoint stores float16 weights like the released ones, so keeping them in float16 is
exact and the decode step must give the float32 step's logits up to summation order. The golden parity of
the generation (tokens exact, step logits within the case tolerance) is checked by tests/models/test_t2s.py,
which runs the numpy decode with this path on (the default where the kernel builds); here: the kernel, the
automatic choice, and the agreement with the float32 step.
"""

from __future__ import annotations  # noqa: I001  (the package must load before mlx)

import dora_primespeech_mlx  # noqa: F401  (preloads a fast BLAS)
import mlx.core as mx
import numpy as np
import pytest
from conftest import load_cases_json, require_fixture

from dora_primespeech_mlx.convert.checkpoints import read_gpt
from dora_primespeech_mlx.models.kernels import half_gemv
from dora_primespeech_mlx.convert.load import from_checkpoint
from dora_primespeech_mlx.models.gpt.numpy_decoder import NumpyDecoder, half_weights
from dora_primespeech_mlx.runtime import Runtime


@pytest.fixture(scope="module")
def fn():
    k = half_gemv.kernel()
    if k is None:
        pytest.skip(f"float16 GPT kernel unavailable here: {half_gemv.status()['why_not']}")
    return k


def _gpt():
    cases = load_cases_json()
    if not cases:
        require_fixture("models/cases.json")
    return from_checkpoint(read_gpt(require_fixture("models/" + cases["checkpoints"]["gpt"])))


@pytest.mark.parametrize("shape", [(7, 37), (64, 192), (1536, 512), (512, 2048)])
def test_kernel_matches_float32_product(fn, shape):
    rng = np.random.default_rng(sum(shape))
    w = (rng.standard_normal(shape) * 0.05).astype(np.float16)
    x = rng.standard_normal(shape[1]).astype(np.float32)
    b = rng.standard_normal(shape[0]).astype(np.float32)
    m = half_gemv.HalfMatrix(w, fn)
    ref = w.astype(np.float64) @ x.astype(np.float64)
    np.testing.assert_allclose(m @ x, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(m.matvec(x, b), ref + b, rtol=1e-5, atol=1e-5)
    xs = rng.standard_normal((3, shape[1])).astype(np.float32)  # the prefill's x @ W.T
    np.testing.assert_allclose(xs @ m.T, xs.astype(np.float64) @ w.astype(np.float64).T, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError):
        m.matvec(x[:-1])


def test_fixture_gpt_decodes_in_float16_like_float32(fn):
    model = _gpt()
    dec = NumpyDecoder(model)  # auto: the fixture checkpoint's weights are float16 values
    assert dec.half
    assert model.predict.weight.dtype == mx.float16
    assert all(b.mlp.fc1.weight.dtype == mx.float16 and b.attn.qkv.weight.dtype == mx.float16 for b in model.layers)
    ref = NumpyDecoder(model, half=False)  # float32 copies of the same weights
    assert not ref.half and isinstance(ref.weights().predict, np.ndarray)
    rng = np.random.default_rng(0)
    a = model.args
    phones = rng.integers(0, a.phoneme_vocab_size, (1, 12)).astype(np.int32)
    bert = (0.1 * rng.standard_normal((1, 1024, 12))).astype(np.float32)
    prompt = rng.integers(0, a.vocab_size - 1, (1, 9)).astype(np.int32)
    s16, l16 = dec.prefill(phones, bert, prompt, 40)
    s32, l32 = ref.prefill(phones, bert, prompt, 40)
    worst = float(np.max(np.abs(l16 - l32)))
    for i, tok in enumerate(rng.integers(0, a.vocab_size - 1, 40)):
        worst = max(worst, float(np.max(np.abs(s16.step(int(tok), 9 + i) - s32.step(int(tok), 9 + i)))))
    print(f"\nfloat16-weight vs float32 decode step: max |logit diff| {worst:.3g} over 40 steps")
    assert worst < 1e-4


def test_auto_keeps_weights_that_are_not_float16(fn):
    model = _gpt()
    w = model.layers[0].mlp.fc1.weight
    model.layers[0].mlp.fc1.weight = w + 1e-7 * (1 + mx.abs(w))  # no longer float16 values
    assert not half_weights(model, Runtime(gpt_half="auto"))
    assert model.layers[0].mlp.fc1.weight.dtype == mx.float32 and model.predict.weight.dtype == mx.float32
    assert not NumpyDecoder(model).half
    forced = Runtime(gpt_half="1")  # forced: rounded to float16
    assert half_weights(model, forced) and model.layers[0].mlp.fc1.weight.dtype == mx.float16


def test_off_and_bad_setting():
    from dora_primespeech_mlx.errors import ConfigError
    from dora_primespeech_mlx.settings import Settings

    with pytest.raises(ConfigError, match=half_gemv.ENV):
        Settings.from_env({half_gemv.ENV: "sometimes"})
    assert Runtime().gpt_half == "auto" and half_gemv.mode(Runtime().gpt_half) == "auto"
    off = Runtime.from_settings(Settings.from_env({half_gemv.ENV: "0"}))
    assert half_gemv.kernel(off.isa, off.gpt_half) is None
    assert half_gemv.status(off.isa, off.gpt_half)["why_not"].startswith(f"{half_gemv.ENV}=0")
    model = _gpt()
    assert not NumpyDecoder(model, runtime=off).half and model.predict.weight.dtype == mx.float32
    assert half_gemv.mode("0") == "off" and half_gemv.mode("1") == "on" and half_gemv.mode("auto") == "auto"
    with pytest.raises(ValueError):
        half_gemv.mode("maybe")
    with pytest.raises(ConfigError, match="gpt_half"):
        Runtime(gpt_half="maybe")
