"""The warm-up synthesis is capped (engine/core.py ``warmup_tokens``): a voice whose short text runs long is not
decoded whole at start; ``synthesize(max_tokens=n)`` speaks exactly the first ``n`` tokens of the uncapped request."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import model_cases, param_or_missing, require_case
from test_engine import FAST, fixture_voice

from dora_primespeech_mlx.engine import GPTSoVITSEngine, core, pipeline

E2E_CASES = model_cases("e2e")
E2E_PARAMS = param_or_missing(E2E_CASES, lambda c: c["name"], "models/cases.json e2e case")


@pytest.mark.parametrize("case", E2E_PARAMS)
def test_the_warmup_speaks_at_most_its_cap(case, tmp_path, monkeypatch):
    case = require_case(case, "models/cases.json")
    eng = GPTSoVITSEngine(model_dir=tmp_path, config=FAST)
    eng.load_voice(fixture_voice(case))
    spoken, real = [], pipeline.generate_tokens

    def counted(*a, **kw):
        out = real(*a, **kw)
        spoken.append(len(out))
        return out

    monkeypatch.setattr(pipeline, "generate_tokens", counted)
    cap = 30  # (below the fixture voice's length: the cap cuts; the engine's config sets it)
    eng.config = FAST.replace(stream_chunk_tokens=cap - FAST.stream_context_tokens - FAST.stream_lookahead_tokens)
    assert core.warmup_tokens(eng.config) == cap
    eng.warmup()
    assert spoken and max(spoken) <= cap
    assert eng.rates.token_s is not None and eng.rates.frame_s is not None  # the speeds streams are paced by

    text = case["inputs"]["text"]
    whole = eng.synthesize(text, seed=7)
    n = len(whole.semantic_tokens)
    assert n >= 2
    for cap in (1, n // 2, n, n + 5):
        part = eng.synthesize(text, seed=7, max_tokens=cap)
        np.testing.assert_array_equal(part.semantic_tokens, whole.semantic_tokens[:cap])
        assert len(part.audio) <= len(whole.audio)
