"""The CBLAS preloaded for MLX on Linux is live and computes correct products."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import dora_primespeech_mlx  # noqa: F401  (preloads the BLAS before mlx)
from dora_primespeech_mlx import _blas


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the reference-BLAS problem is Linux-only")
def test_fast_blas_loaded():
    info = _blas.info()
    assert info["name"] is not None, info["error"]


@pytest.mark.parametrize("shape", [(1, 512, 2048), (37, 65, 19), (128, 128, 128)])
@pytest.mark.parametrize("trans", [(False, False), (True, False), (False, True)])
def test_matmul_matches_numpy(shape, trans):
    import mlx.core as mx

    m, k, n = shape
    rng = np.random.default_rng(0)
    a = rng.standard_normal((k, m) if trans[0] else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if trans[1] else (k, n)).astype(np.float32)
    ma, mb = mx.array(a), mx.array(b)
    if trans[0]:
        ma, a = ma.T, a.T
    if trans[1]:
        mb, b = mb.T, b.T
    got = np.array(ma @ mb)
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4)


def test_float64_matmul_on_cpu():
    import mlx.core as mx

    a = np.random.default_rng(1).standard_normal((33, 17))
    got = np.array(mx.matmul(mx.array(a), mx.array(a.T), stream=mx.cpu))
    np.testing.assert_allclose(got, a @ a.T, rtol=1e-5, atol=1e-5)
