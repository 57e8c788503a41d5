"""macOS only: real CoreML prediction of the exported fixture encoders (CPU+ANE and all compute units),
compared with MLX, the compiled-model cache, and latency. Skipped elsewhere (CoreML cannot predict off
macOS); the Linux tests check the same programs with the numpy MIL interpreter instead."""

from __future__ import annotations

import functools
import sys
import time

import numpy as np
import pytest
from conftest import model_cases, require_case, require_fixture
from coreml_testlib import CASES_JSON, assert_close, assert_fp16_bound, model_dir

pytestmark = [
    pytest.mark.macos,
    pytest.mark.skipif(sys.platform != "darwin", reason="CoreML prediction needs macOS (not run on this platform)"),
]


@functools.lru_cache(maxsize=1)
def _mlx_hubert(path: str):
    from dora_primespeech_mlx.convert.load import load_hubert

    return load_hubert(path, cache=False)


def _backends(tmp_path, precision, units):
    from dora_primespeech_mlx.engine.encoders import EncoderBackends

    return EncoderBackends(model_dir("hubert"), model_dir("bert"), mode="coreml", root=tmp_path,
                           compute_units=units, precision=precision)


@pytest.mark.parametrize(("precision", "units"), [("fp16", "CPU_AND_NE"), ("fp16", "ALL"), ("fp32", "CPU_ONLY")])
def test_real_prediction_matches(tmp_path, precision, units):
    from dora_primespeech_mlx.coreml import runtime
    from dora_primespeech_mlx.models.hubert.model import prompt_features

    enc = _backends(tmp_path, precision, units)
    hcase = require_case((model_cases("hubert") or [None])[0], CASES_JSON)
    wav = np.load(require_fixture(f"models/{hcase['file']}"))["wav16k"].astype(np.float32)
    want = np.asarray(prompt_features(_mlx_hubert(str(model_dir("hubert"))), wav))
    got = enc.hubert_features(wav)
    exact = precision == "fp32" and units == "CPU_ONLY"  # fp32 on the CPU: the fixture tolerances
    if exact:
        assert_close("coreml hubert", got, want, hcase["tolerance"]["last_hidden_state"])
    else:
        assert_fp16_bound("coreml hubert", got, want)
    for c in model_cases("bert"):
        gold = np.load(require_fixture(f"models/{c['file']}"))
        got = enc.bert_features(c["norm_text"], [int(n) for n in gold["word2ph"]])
        if exact:
            assert_close(f"coreml {c['name']}", got, gold["phone_features"], c["tolerance"]["phone_features"])
        else:
            assert_fp16_bound(f"coreml {c['name']}", got, gold["phone_features"])
    st = enc.status()
    assert st["hubert"]["backend"] == "coreml" and not st["hubert"]["fallback"], st
    assert st["bert"]["backend"] == "coreml" and not st["bert"]["fallback"], st
    for kind in ("hubert", "bert"):
        assert runtime.compiled_path(st[kind]["package"]).is_dir()  # compiled model cached next to the package


def test_latency(tmp_path):
    """Per-call latency of the fixture encoders on CPU+ANE after warm-up (printed; generous bound)."""
    enc = _backends(tmp_path, "fp16", "CPU_AND_NE")
    wav = np.random.default_rng(0).uniform(-0.5, 0.5, 5 * 16000).astype(np.float32)
    c = model_cases("bert")[0]
    gold = np.load(require_fixture(f"models/{c['file']}"))
    w2p = [int(n) for n in gold["word2ph"]]
    enc.hubert_features(wav)
    enc.bert_features(c["norm_text"], w2p)
    t0 = time.perf_counter()
    for _ in range(5):
        enc.hubert_features(wav)
    t_h = (time.perf_counter() - t0) / 5
    t0 = time.perf_counter()
    for _ in range(5):
        enc.bert_features(c["norm_text"], w2p)
    t_b = (time.perf_counter() - t0) / 5
    print(f"CoreML CPU_AND_NE latency: hubert 5 s clip {t_h * 1000:.1f} ms, bert {t_b * 1000:.1f} ms")
    assert enc.status()["hubert"]["backend"] == "coreml"
    assert t_h < 2.0 and t_b < 1.0
