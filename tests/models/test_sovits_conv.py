"""The GEMM formulations of conv1d / conv_transpose1d (models/sovits/conv.py) against native MLX and a numpy
float64 reference, and the path switch. Random data only: no fixtures needed."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from dora_primespeech_mlx.models.sovits import conv
from dora_primespeech_mlx.models.sovits.hifigan import Generator, ResBlock1

ATOL = 1e-5  # both paths are float32 GEMMs over the same products; outputs are O(1) by construction


def _rand(rng, shape, fan_in=1):
    return mx.array((rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32))


def _np_conv1d(x, w, b, stride, left, right, dilation):
    """float64 reference, torch semantics. x (B, L, Ci), w (Co, K, Ci)."""
    x = np.pad(np.asarray(x, np.float64), [(0, 0), (left, right), (0, 0)])
    w = np.asarray(w, np.float64)
    co, k, _ = w.shape
    n = (x.shape[1] - dilation * (k - 1) - 1) // stride + 1
    out = np.zeros((x.shape[0], n, co))
    for t in range(n):
        for j in range(k):
            out[:, t] += x[:, t * stride + j * dilation] @ w[:, j].T
    return out + np.asarray(b, np.float64)


def _np_conv_transpose1d(x, w, b, stride, padding):
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    bsz, length, _ = x.shape
    co, k, _ = w.shape
    full = np.zeros((bsz, (length - 1) * stride + k, co))
    for t in range(length):
        for j in range(k):
            full[:, t * stride + j] += x[:, t] @ w[:, j].T
    return full[:, padding : full.shape[1] - padding] + np.asarray(b, np.float64)


CONV_SHAPES = [  # (Ci, Co, K, stride, (left, right), dilation, L)
    (16, 16, 3, 1, (1, 1), 1, 40),
    (16, 16, 11, 1, (25, 25), 5, 60),
    (16, 16, 7, 1, (9, 9), 3, 33),
    (12, 20, 3, 1, (1, 1), 1, 5),  # "same" FFN padding
    (12, 20, 4, 1, (1, 2), 1, 9),  # asymmetric padding
    (24, 24, 2, 2, (0, 0), 1, 31),  # 25 Hz ssl_proj, odd length
    (8, 6, 5, 2, (3, 1), 2, 30),
    (8, 6, 1, 1, (0, 0), 1, 10),
]


@pytest.mark.parametrize("shape", CONV_SHAPES, ids=lambda s: "ci{}_co{}_k{}_s{}_p{}_d{}".format(*s[:6]))
def test_conv1d_gemm_matches_native_and_reference(shape):
    ci, co, k, stride, pad, dilation, length = shape
    rng = np.random.default_rng(k * 100 + dilation)
    x = _rand(rng, (2, length, ci))
    w = _rand(rng, (co, k, ci), k * ci)
    b = _rand(rng, (co,))
    gemm = np.asarray(conv.conv1d_gemm(x, w, b, stride, pad, dilation))
    native = np.asarray(conv.conv1d_native(x, w, b, stride, pad, dilation))
    ref = _np_conv1d(x, w, b, stride, pad[0], pad[1], dilation)
    assert gemm.shape == native.shape == ref.shape
    np.testing.assert_allclose(gemm, native, atol=ATOL)
    np.testing.assert_allclose(gemm, ref, atol=ATOL)


TRANSPOSE_SHAPES = [  # (Ci, Co, K, stride, padding, L): the generator's stages and odd ones
    (32, 16, 16, 10, 3, 7),
    (16, 8, 16, 8, 4, 9),
    (8, 4, 8, 2, 3, 20),
    (4, 2, 2, 2, 0, 31),
    (6, 5, 7, 3, 2, 4),
    (6, 5, 3, 4, 0, 5),  # kernel shorter than the stride
]


@pytest.mark.parametrize("shape", TRANSPOSE_SHAPES, ids=lambda s: "ci{}_co{}_k{}_s{}_p{}".format(*s[:5]))
def test_conv_transpose1d_gemm_matches_native_and_reference(shape):
    ci, co, k, stride, padding, length = shape
    rng = np.random.default_rng(k * 10 + stride)
    x = _rand(rng, (2, length, ci))
    w = _rand(rng, (co, k, ci), ci * max(1, k // stride))
    b = _rand(rng, (co,))
    gemm = np.asarray(conv.conv_transpose1d_gemm(x, conv.transpose_gemm_weight(w, stride), b, k, stride, padding))
    native = np.asarray(conv.conv_transpose1d_native(x, w, b, stride, padding))
    ref = _np_conv_transpose1d(x, w, b, stride, padding)
    assert gemm.shape == ref.shape == (2, (length - 1) * stride + k - 2 * padding, co)
    np.testing.assert_allclose(gemm, ref, atol=ATOL)
    np.testing.assert_allclose(gemm, native, atol=ATOL)


def test_switch():
    assert conv.use_gemm("auto") == (mx.default_device().type == mx.cpu)
    assert not conv.use_gemm("native")
    assert conv.use_gemm("gemm")
    with pytest.raises(ValueError, match="unknown conv implementation"):
        conv.check_impl("fft")


def test_each_model_keeps_its_own_form():
    """Two generators with different forms side by side: each convolution follows its own model's form, the
    same samples either way (no process-wide switch)."""
    rng = np.random.default_rng(4)
    a = _random_generator(rng)
    b = Generator(8, [3, 7, 11], [[1, 3, 5]] * 3, [10, 8, 2, 2, 2], 32, [16, 16, 8, 2, 2], 16)
    b.update(a.parameters())
    assert conv.set_impl(a, "gemm") == "gemm" and conv.set_impl(b, "native") == "native"
    convs = [m for _, m in a.named_modules() if isinstance(m, (conv.Conv1d, conv.ConvTranspose1d))]
    assert convs and all(m.impl == "gemm" for m in convs)
    assert all(m.impl == "native" for _, m in b.named_modules() if isinstance(m, (conv.Conv1d, conv.ConvTranspose1d)))
    x = mx.array(rng.standard_normal((1, 20, 8)).astype(np.float32))
    g = mx.array(rng.standard_normal((1, 1, 16)).astype(np.float32))
    np.testing.assert_allclose(np.array(a(x, g)), np.array(b(x, g)), atol=ATOL)


def _random_generator(rng) -> Generator:
    gen = Generator(8, [3, 7, 11], [[1, 3, 5]] * 3, [10, 8, 2, 2, 2], 32, [16, 16, 8, 2, 2], 16)
    params = {}
    for name, value in _flatten(gen.parameters()):
        fan_in = value.shape[-1] * (value.shape[1] if value.ndim == 3 else 1)
        params[name] = _rand(rng, value.shape, fan_in)
    gen.load_weights(list(params.items()), strict=True)
    return gen


def _flatten(tree, prefix=""):
    from mlx.utils import tree_flatten

    return tree_flatten(tree, prefix=prefix)


def test_generator_paths_agree():
    rng = np.random.default_rng(5)
    gen = _random_generator(rng)
    x = _rand(rng, (1, 6, 8))
    g = _rand(rng, (1, 1, 16))
    conv.set_impl(gen, "gemm")
    a = np.asarray(gen(x, g))
    conv.set_impl(gen, "native")
    b = np.asarray(gen(x, g))
    assert a.shape == (1, 6 * 640, 1)
    np.testing.assert_allclose(a, b, atol=ATOL)


def test_gemm_weight_cache_follows_loaded_weights():
    rng = np.random.default_rng(6)
    layer = conv.ConvTranspose1d(4, 3, 4, 2, padding=1)
    layer.impl = "gemm"
    x = _rand(rng, (1, 5, 4))
    w1, w2 = _rand(rng, (3, 4, 4)), _rand(rng, (3, 4, 4))
    layer.load_weights([("weight", w1), ("bias", mx.zeros((3,)))])
    layer.prepare()
    y1 = np.asarray(layer(x))
    layer.load_weights([("weight", w2), ("bias", mx.zeros((3,)))])
    y2 = np.asarray(layer(x))
    np.testing.assert_allclose(y2, np.asarray(conv.conv_transpose1d_native(x, w2, None, 2, 1)), atol=ATOL)
    assert np.abs(y1 - y2).max() > 1e-3
    assert "_cache" not in dict(_flatten(layer.parameters()))


def test_resblock_dilated_paths_agree():
    rng = np.random.default_rng(7)
    block = ResBlock1(8, 11, [1, 3, 5])
    block.load_weights([(n, _rand(rng, v.shape, 88)) for n, v in _flatten(block.parameters())], strict=True)
    x = _rand(rng, (1, 50, 8))
    conv.set_impl(block, "gemm")
    a = np.asarray(block(x))
    conv.set_impl(block, "native")
    np.testing.assert_allclose(a, np.asarray(block(x)), atol=ATOL)


def test_conv1d_gemm_on_views():
    """The strided im2col must read views (transposes, offset slices) correctly, without padding."""
    rng = np.random.default_rng(8)
    base = _rand(rng, (3, 8, 40))
    w = _rand(rng, (5, 3, 8), 24)
    for x in (base.transpose(0, 2, 1), base.transpose(0, 2, 1)[1:2, 5:31]):
        ref = _np_conv1d(x, w, np.zeros(5), 1, 0, 0, 2)
        np.testing.assert_allclose(np.asarray(conv.conv1d_gemm(x, w, None, 1, 0, 2)), ref, atol=ATOL)
