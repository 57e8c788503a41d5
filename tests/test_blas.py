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


_PROBE = """
import json, sys
import mlx.core  # noqa: F401  (before the package: too late to preload)
from dora_primespeech_mlx import _blas
import dora_primespeech_mlx.models  # noqa: F401  (runs the preload)
print(json.dumps(_blas.report()))
"""


def _probe(env_extra: dict[str, str]) -> dict:
    import json
    import os
    import subprocess

    env = {**os.environ, **env_extra}
    env.pop("PRIMESPEECH_BLAS", None)
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the reference-BLAS problem is Linux-only")
def test_mlx_imported_first_names_the_library_to_preload():
    """An application that imports ``mlx`` before this package gets no fast BLAS from the preload (the symbols
    are bound); the warning names the library for ``LD_PRELOAD``, and with it MLX's products are fast again."""
    if _blas.info()["name"] in (None, "preloaded"):
        pytest.skip(f"no loadable fast BLAS here to name: {_blas.info()}")
    late = _probe({})
    assert late["name"] is None
    assert late["path"] and f"LD_PRELOAD={late['path']}" in late["error"], late
    preloaded = _probe({"LD_PRELOAD": late["path"]})
    assert preloaded["name"] == "preloaded" and preloaded["error"] is None, preloaded
    # the same product, reference BLAS against the named library, measured in one run: several times faster
    assert preloaded["matmul_ms"] * 2 < late["matmul_ms"], (late, preloaded)


def _openblas_threads() -> int | None:
    """The thread count numpy's OpenBLAS (the one the shim forwards MLX to) uses now, None where it cannot say."""
    import ctypes

    path = _blas._numpy_openblas()
    if path is None:
        return None
    lib = ctypes.CDLL(path)
    for sym in ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads", "openblas_get_num_threads"):
        if hasattr(lib, sym):
            fn = getattr(lib, sym)
            fn.restype = ctypes.c_int
            return int(fn())
    return None


@pytest.fixture
def restore_blas_threads():
    before = _blas.thread_settings()
    yield
    _blas.configure_threads(before["blas_threads"] if before.get("reason") == "explicit" else None)


def test_hold_one_thread_keeps_the_blas_to_one_thread_until_released(restore_blas_threads):
    if _openblas_threads() is None:
        pytest.skip("numpy's OpenBLAS cannot report its thread count here")
    _blas.configure_threads(2)
    assert _openblas_threads() == 2
    _blas.hold_one_thread(True)
    _blas.hold_one_thread(True)  # (twice: still one hold)
    assert _openblas_threads() == 1
    _blas.hold_one_thread(False)
    assert _openblas_threads() == 2
    _blas.hold_one_thread(True)
    _blas.configure_threads(3)  # a count set during a hold replaces it; releasing keeps the new count
    _blas.hold_one_thread(False)
    assert _openblas_threads() == 3
    _blas.configure_threads(1)  # one thread: nothing to hold
    _blas.hold_one_thread(True)
    _blas.hold_one_thread(False)
    assert _openblas_threads() == 1
