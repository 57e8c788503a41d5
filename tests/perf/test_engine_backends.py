"""engine.stats() names the backends in use (BLAS and its threads), and the settings choose the GPT
decoder once, when the engine loads the GPT."""

from __future__ import annotations  # noqa: I001  (the package must load before mlx)

import dora_primespeech_mlx  # noqa: F401  (preloads a fast BLAS)
import pytest
from conftest import load_cases_json, require_fixture

from dora_primespeech_mlx import _blas
from dora_primespeech_mlx.engine import GPTSoVITSEngine
from dora_primespeech_mlx.models.gpt.decode import decoder_kind
from dora_primespeech_mlx.settings import Settings


def test_stats_report_blas_and_threads(tmp_path):
    backends = GPTSoVITSEngine(model_dir=tmp_path).stats()["backends"]
    assert backends["gpt"] == "not loaded"
    assert backends["blas"]["name"] == _blas.info()["name"]
    assert backends["blas"]["threads"] == _blas.thread_settings()
    assert backends["encoders"] == {"mode": "auto"}


@pytest.mark.parametrize(
    "env, kind",
    [
        ({}, decoder_kind()),
        ({"PRIMESPEECH_T2S_DECODE": "numpy", "PRIMESPEECH_T2S_COMPILE": "1"}, "numpy"),
        ({"PRIMESPEECH_T2S_DECODE": "mlx", "PRIMESPEECH_T2S_COMPILE": "0"}, "mlx"),
        ({"PRIMESPEECH_T2S_DECODE": "mlx", "PRIMESPEECH_T2S_COMPILE": "1"}, "compile"),
    ],
    ids=["default", "numpy", "mlx-eager", "mlx-compiled"],
)
def test_settings_choose_the_gpt_decoder(tmp_path, env, kind):
    cases = load_cases_json() or {"checkpoints": {"gpt": "missing"}}
    path = require_fixture("models/" + cases["checkpoints"]["gpt"])
    engine = GPTSoVITSEngine(model_dir=tmp_path, settings=Settings.from_env(env))
    gpt = engine.store.model("gpt", path, "fixture")
    assert gpt.decoder.kind == kind
    assert gpt.decoder.backend == ("numpy" if kind == "numpy" else "mlx")
