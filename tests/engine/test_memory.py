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


def test_a_voice_loads_roberta_after_its_reference_forward(tmp_path, monkeypatch):
    """Loading a voice: every model load starts from a trimmed heap, and CNHubert's forward on the reference runs
    before RoBERTa loads (its activations beside RoBERTa set the loading's peak, docs/memory.md)."""
    from conftest import require_case
    from test_engine import E2E_CASES, fixture_voice

    from dora_primespeech_mlx.convert import load
    from dora_primespeech_mlx.engine import GPTSoVITSEngine, encoders

    events = []
    real_trim = store.trim_after_request
    monkeypatch.setattr(store, "trim_after_request", lambda: events.append("trim") or real_trim())
    for kind in ("gpt", "sovits", "hubert", "bert"):
        real = getattr(load, f"load_{kind}")
        monkeypatch.setattr(load, f"load_{kind}", lambda *a, _k=kind, _f=real, **kw: events.append(_k) or _f(*a, **kw))
    real_forward = encoders.EncoderBackends.hubert_features
    monkeypatch.setattr(encoders.EncoderBackends, "hubert_features",
                        lambda self, wav: events.append("forward") or real_forward(self, wav))
    voice = fixture_voice(require_case(E2E_CASES[0] if E2E_CASES else None, "models/cases.json"))
    GPTSoVITSEngine(model_dir=tmp_path).load_voice(voice)
    loads = [i for i, e in enumerate(events) if e in ("gpt", "sovits", "hubert", "bert")]
    assert {events[i] for i in loads} >= {"gpt", "sovits", "hubert"}, events
    assert all(events[i - 1] == "trim" for i in loads), events
    assert "forward" in events
    if "bert" in events:  # (a voice whose prompt is not Chinese needs no RoBERTa)
        assert events.index("forward") < events.index("bert"), events


def test_roberta_converts_its_word_embedding_first(monkeypatch):
    """float16 RoBERTa: the word embedding (its largest weight) is converted before any other weight is read, so
    its float32, numpy and float16 copies never sit beside the converted rest."""
    from conftest import model_cases, require_fixture

    from dora_primespeech_mlx.convert.load import load_bert
    from dora_primespeech_mlx.models.bert import model as bert_model
    from dora_primespeech_mlx.models.kernels import half_gemv
    from dora_primespeech_mlx.runtime import Runtime

    if half_gemv.library() is None:
        pytest.skip("no float16 kernels here: RoBERTa stays float32")
    cases = model_cases("bert")
    if not cases:
        require_fixture("models/cases.json")
    shapes, real = [], bert_model.to_float16_exact
    monkeypatch.setattr(bert_model, "to_float16_exact", lambda a, fn: shapes.append(a.shape) or real(a, fn))
    model, _ = load_bert(require_fixture("models/" + cases[0]["model"]), cache=False, runtime=Runtime())
    if model.embeddings.word_embeddings.weight.dtype != mx.float16:
        pytest.skip("the fixture RoBERTa's weights are not float16 values: kept float32")
    assert shapes[0] == tuple(model.embeddings.word_embeddings.weight.shape), shapes[:3]
    assert len(shapes) == len(model._linears()) + 1
