"""Memory hand-back at the end of a request (engine/store.py ``trim_after_request``): MLX's buffer cache is
emptied and the heap's free pages go back to the OS. The RSS figures themselves come from
``primespeech-mlx bench`` (``--memory-levers``), not from a test."""

from __future__ import annotations

import sys

import mlx.core as mx
import pytest

from dora_primespeech_mlx.engine import store


def test_trim_after_request_empties_the_mlx_cache():
    a = mx.ones((1024, 1024))
    mx.eval(a)
    del a  # freed into MLX's buffer cache
    assert mx.get_cache_memory() > 0
    store.trim_after_request()
    assert mx.get_cache_memory() == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc_trim is glibc's")
def test_trim_after_request_hands_freed_heap_back(monkeypatch):
    calls = []
    real = store.trim_heap
    monkeypatch.setattr(store, "trim_heap", lambda: calls.append(1) or real())
    store.trim_after_request()
    assert calls == [1]


def test_numpy_gpt_decoder_weights_are_built_at_load(tmp_path):
    """``load_gpt`` builds the numpy decoder's float16 weights while loading (the float32 ones are handed back
    before the next model loads), and the loaded model decodes like one converted at its first token."""
    import numpy as np
    from conftest import load_cases_json, require_fixture

    from dora_primespeech_mlx.convert import load
    from dora_primespeech_mlx.models.kernels import half_gemv
    from dora_primespeech_mlx.runtime import Runtime

    if half_gemv.kernel() is None:
        pytest.skip(f"float16 GPT kernel unavailable here: {half_gemv.status()['why_not']}")
    cases = load_cases_json()
    if not cases:
        require_fixture("models/cases.json")
    converted = load.convert(require_fixture("models/" + cases["checkpoints"]["gpt"]), tmp_path / "gpt", "gpt")
    model = load.load_gpt(converted, runtime=Runtime(t2s_decode="numpy"))
    assert model.predict.weight.dtype == mx.float16 and model.decoder.half
    assert all(b.attn.qkv.weight.dtype == mx.float16 for b in model.layers)
    lazy = load.load(converted, "gpt", runtime=Runtime(t2s_decode="numpy"))  # the generic loader: at the first use
    assert lazy.predict.weight.dtype == mx.float32
    rng = np.random.default_rng(0)
    a = model.args
    phones = rng.integers(0, a.phoneme_vocab_size, (1, 9)).astype(np.int32)
    bert = (0.1 * rng.standard_normal((1, 1024, 9))).astype(np.float32)
    prompt = rng.integers(0, 1024, (1, 5)).astype(np.int32)
    (_, logits), (_, lazy_logits) = model.decoder.prefill(phones, bert, prompt, 4), lazy.decoder.prefill(
        phones, bert, prompt, 4)
    np.testing.assert_array_equal(logits, lazy_logits)
