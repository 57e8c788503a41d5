"""engine.stats() names the backends actually in use: the GPT decode path, the BLAS and its threads."""

from __future__ import annotations  # noqa: I001  (the package must load before mlx)

import dora_primespeech_mlx  # noqa: F401  (preloads a fast BLAS)
from dora_primespeech_mlx import _blas
from dora_primespeech_mlx.engine import GPTSoVITSEngine
from dora_primespeech_mlx.models import t2s_generate


def test_stats_report_decode_backend_blas_and_threads(tmp_path, monkeypatch):
    monkeypatch.delenv("PRIMESPEECH_T2S_DECODE", raising=False)
    backends = GPTSoVITSEngine(model_dir=tmp_path).stats()["backends"]
    assert backends["gpt"] == t2s_generate.decode_backend()
    assert backends["blas"]["name"] == _blas.info()["name"]
    assert backends["blas"]["threads"] == _blas.thread_settings()
    assert backends["encoders"] == {"mode": "auto"}


def test_stats_follow_a_forced_decode_backend(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMESPEECH_T2S_DECODE", "mlx")
    assert GPTSoVITSEngine(model_dir=tmp_path).stats()["backends"]["gpt"] == "mlx"
    monkeypatch.setenv("PRIMESPEECH_T2S_DECODE", "numpy")
    assert GPTSoVITSEngine(model_dir=tmp_path).stats()["backends"]["gpt"] == "numpy"
