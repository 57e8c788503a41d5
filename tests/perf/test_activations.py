"""The fast GELU (models/shared/activations.py) is the exact erf GELU to float32 accuracy."""

from __future__ import annotations  # noqa: I001  (the package must load before mlx)

import math

import dora_primespeech_mlx  # noqa: F401  (preloads a fast BLAS)
import mlx.core as mx
import mlx.nn as nn
import numpy as np

from dora_primespeech_mlx.models.shared.activations import erf, gelu


def test_erf_matches_the_exact_function():
    x = np.linspace(-8, 8, 40001, dtype=np.float32)
    exact = np.array([math.erf(float(v)) for v in x])
    err = np.abs(np.array(erf(mx.array(x)), dtype=np.float64) - exact).max()
    assert err < 1e-6, err
    assert np.array(erf(mx.array(x)))[[0, -1]].tolist() == [-1.0, 1.0]


def test_gelu_matches_the_erf_gelu_on_any_shape():
    rng = np.random.default_rng(0)
    for shape in [(3,), (2, 7, 33), (1, 23, 512)]:  # shapeless compile: one kernel for every shape
        x = (4 * rng.standard_normal(shape)).astype(np.float32)
        exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.ravel().tolist()]).reshape(shape)
        got = np.array(gelu(mx.array(x)), dtype=np.float64)
        np.testing.assert_allclose(got, exact, rtol=2e-6, atol=2e-6)
        np.testing.assert_allclose(got, np.array(nn.gelu(mx.array(x))), rtol=2e-6, atol=2e-6)


def test_other_dtypes_take_mlx_gelu():
    x = mx.array(np.linspace(-3, 3, 11, dtype=np.float32)).astype(mx.float16)
    out = gelu(x)
    assert out.dtype == mx.float16
    np.testing.assert_array_equal(np.array(out), np.array(nn.gelu(x)))
