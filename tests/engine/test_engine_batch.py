"""Continuous batching in the engine (engine/batching.py, PRIMESPEECH_BATCH): a request's later sentences and the
texts queued behind it decode beside the sentence being spoken, and every sentence's tokens (and a whole
synthesis's audio) are exactly those of its decode alone with the same seed."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest
from test_engine import GenerateSpy, case, model_dir, voice  # noqa: F401  (shared fixtures)
from test_engine import engine as engine  # noqa: F401,F811

from dora_primespeech_mlx.engine import batching, pacing, pipeline
from dora_primespeech_mlx.models.gpt import batch as t2s_batch

MULTI = "Hello world, this is a small test. The second sentence comes next. And a third one follows it now."
KW = {"text_split_method": "cut5", "top_k": 5, "stream_pace": False}


@pytest.fixture
def batched(engine, monkeypatch):
    """The engine with batching on, whatever the machine's setting; skips where the GPT cannot batch (no float16
    kernels: MLX steps rows one by one)."""
    engine.batching.drop_joined()
    monkeypatch.setattr(engine, "settings", dataclasses.replace(engine.settings, batch=4))
    models = engine.store.models(engine.voice)
    if pipeline.batch_width(models, 4) < 2:
        pytest.skip("the GPT decodes without the float16 kernels here: nothing to batch")
    widest = []
    real = t2s_batch.step_together

    def spy(gens):
        widest.append(len(gens))
        return real(gens)

    monkeypatch.setattr(t2s_batch, "step_together", spy)
    return widest


def _sentences(engine, text) -> int:
    return len(pipeline.text_chunks(text, engine.voice.language, "cut5", engine.voice,
                                    engine.store.models(engine.voice), pipeline.Timer(), data=engine.text_data))


def test_whole_synthesis_batched_equals_one_by_one(engine, batched, monkeypatch):
    if _sentences(engine, MULTI) < 2:
        pytest.skip("the front end gives one sentence for the text with this voice")
    many = engine.synthesize(MULTI, seed=11, **KW)
    assert max(batched) >= 2, "the sentences did not decode together"
    monkeypatch.setattr(engine, "settings", dataclasses.replace(engine.settings, batch=1))
    batched.clear()
    one = engine.synthesize(MULTI, seed=11, **KW)
    assert not batched
    np.testing.assert_array_equal(many.semantic_tokens, one.semantic_tokens)
    np.testing.assert_array_equal(many.audio, one.audio)


def test_a_batched_synthesis_measures_the_speeds_a_first_stream_is_paced_by(engine, batched, monkeypatch):
    """After a whole synthesis whose sentences decoded together, the engine knows every speed its streams are paced
    by (else the next stream would go unpaced): the first sentence's SoVITS ran with nothing beside it, and its
    batched steps, slower than steps alone, stand in for the GPT's speed until a step alone is measured; they never
    replace a measured one, and later sentences (read from tokens decoded earlier, in ~0 s) are never taken."""
    if _sentences(engine, MULTI) < 2:
        pytest.skip("the front end gives one sentence for the text with this voice")
    rates = pacing.StreamRates()
    monkeypatch.setattr(engine, "rates", rates)
    engine.synthesize(MULTI, seed=11, **KW)
    assert max(batched) >= 2, "the sentences did not decode together"
    assert rates.known(), rates.as_dict()
    assert len(rates._now.seen["token_s"]) == 1, "only the first sentence's batched steps stand in"
    measured = pacing.StreamRates()
    measured.note_tokens(0.5, 100)
    monkeypatch.setattr(engine, "rates", measured)
    engine.synthesize(MULTI, seed=11, **KW)
    assert measured.token_s == pytest.approx(0.005)  # (noted at no thread count: it stands in at every count)
    assert sum(len(speeds.seen["token_s"]) for speeds in measured._by_count.values()) == 1


def test_stream_sentences_keep_their_tokens(engine, batched, monkeypatch):
    monkeypatch.setattr(batching, "ADMIT_QUEUED_S", 0.0)  # join as soon as audio is out (the fixture GPT is fast)
    n = _sentences(engine, MULTI)
    if n < 2:
        pytest.skip("the front end gives one sentence for the text with this voice")
    spy = GenerateSpy(monkeypatch)
    chunks = list(engine.synthesize_stream(MULTI, seed=5, **KW))
    together = dict(spy.tokens)
    assert max(batched) >= 2 and sorted({c.sentence_index for c in chunks}) == list(range(n))
    monkeypatch.setattr(engine, "settings", dataclasses.replace(engine.settings, batch=1))
    spy = GenerateSpy(monkeypatch)
    list(engine.synthesize_stream(MULTI, seed=5, **KW))
    assert together == spy.tokens


def test_queued_text_joins_and_its_request_goes_on(engine, batched, monkeypatch):
    monkeypatch.setattr(batching, "ADMIT_QUEUED_S", 0.0)
    monkeypatch.setattr(batching, "UPCOMING_EVERY_S", 0.0)
    first, queued = "Hello world, this is the first message.", "And this is the message queued behind it."
    q_kw = {**KW, "seed": 23}
    spy = GenerateSpy(monkeypatch)
    alone = list(engine.synthesize_stream(queued, **q_kw))
    want = list(spy.tokens.values())

    spy = GenerateSpy(monkeypatch)
    asked = []

    def upcoming():
        asked.append(1)
        return [batching.Upcoming("q", queued, None, q_kw)]

    list(engine.synthesize_stream(first, key="f", upcoming=upcoming, seed=22, **KW))
    assert asked and "q" in engine.batching.joined, "the queued text did not join"
    st = engine.stats()["decode_batch"]
    assert st["width"] == 4 and st["joined"] == 1 and st["rows_per_step"] > 1
    calls_before = len(spy.calls)
    got = list(engine.synthesize_stream(queued, key="q", upcoming=lambda: [], **q_kw))
    assert len(spy.calls) == calls_before, "its first sentence was decoded again instead of going on"
    assert [spy.tokens[i] for i in sorted(spy.tokens)][-len(want):] == want
    assert sum(len(c.audio) for c in got) > 0 and len(got) >= 1 and len(alone) >= 1


def test_a_cancelled_or_changed_queued_text_is_dropped(engine, batched, monkeypatch):
    monkeypatch.setattr(batching, "ADMIT_QUEUED_S", 0.0)
    monkeypatch.setattr(batching, "UPCOMING_EVERY_S", 0.0)
    first, queued = "Hello world, this is the first message.", "And this is the message queued behind it."
    queue = [batching.Upcoming("q", queued, None, dict(KW))]
    list(engine.synthesize_stream(first, key="f", upcoming=lambda: list(queue), **KW))
    assert "q" in engine.batching.joined
    row = next(iter(engine.batching.joined["q"].request.rows.values()))
    assert engine.batching.take("q", queued + " (edited)", None, dict(KW)) is None  # another text: not reused
    assert row.finished and "q" not in engine.batching.joined
    # a caller without a queue: whatever joined before is dropped, so no stale row keeps stepping
    list(engine.synthesize_stream(first, key="f2", upcoming=lambda: list(queue), **KW))
    assert "q" in engine.batching.joined
    list(engine.synthesize_stream("Something else entirely.", **KW))
    assert not engine.batching.joined
    assert all(r.finished for r in engine.batching.batch.rows) or not engine.batching.batch.rows
    # a joined text cancelled meanwhile (a reset) leaves the batch when the next request starts
    cancel = threading.Event()
    queue = [batching.Upcoming("q2", queued, None, dict(KW), cancel)]
    list(engine.synthesize_stream(first, key="f3", upcoming=lambda: list(queue), **KW))
    row = next(iter(engine.batching.joined["q2"].request.rows.values()))
    cancel.set()
    list(engine.synthesize_stream(first, key="f4", upcoming=lambda: list(queue), **KW))
    assert row.finished and "q2" not in engine.batching.joined


def test_hostile_queued_texts_do_not_join_or_break_the_stream(engine, batched, monkeypatch):
    """Queued texts that cannot be spoken (punctuation only, a bad override, an unknown voice, not a string) are left
    out of the batch; the stream being spoken is unaffected, and each one's own call still raises its error."""
    from dora_primespeech_mlx.errors import PrimeSpeechError

    monkeypatch.setattr(batching, "ADMIT_QUEUED_S", 0.0)
    monkeypatch.setattr(batching, "UPCOMING_EVERY_S", 0.0)
    first = "Hello world, this is the first message."
    bad = [batching.Upcoming("punct", "。，！？...", None, dict(KW)),
           batching.Upcoming("override", "Hello there.", None, {**KW, "top_k": "many"}),
           batching.Upcoming("voice", "Hello there.", "Nobody At All", dict(KW)),
           batching.Upcoming("bytes", b"\xff\xfe", None, dict(KW))]
    alone = list(engine.synthesize_stream(first, seed=3, **KW))
    got = list(engine.synthesize_stream(first, key="f", upcoming=lambda: list(bad), seed=3, **KW))
    assert not engine.batching.joined and engine.batching.refused == {u.key for u in bad}
    assert [len(c.audio) for c in got] == [len(c.audio) for c in alone]
    for u in bad:
        with pytest.raises((PrimeSpeechError, ValueError, TypeError)):
            list(engine.synthesize_stream(u.text, voice=u.voice, key=u.key, upcoming=lambda: [], **u.overrides))


@pytest.mark.parametrize("join", [False, True])
def test_waiting_sentences_join_a_covering_decode_only_when_the_plan_says(engine, batched, monkeypatch, join):
    """While a sentence's pacer covers (the plan counts on its steps alone), the sentences waiting behind it do not
    join its decode; a plan with ``join_while_covering`` lets them (PacingOptions, not an engine attribute)."""
    import time

    from dora_primespeech_mlx.engine import stream as stream_mod

    if _sentences(engine, MULTI) < 2:
        pytest.skip("the front end gives one sentence for the text with this voice")

    class Covering(pacing.Pacer):
        covering = property(lambda self: True, lambda self, value: None)  # always covering

    monkeypatch.setattr(pacing, "Pacer", Covering)
    monkeypatch.setattr(batching, "ADMIT_QUEUED_S", 0.0)
    monkeypatch.setattr(engine, "pacing_plan", pacing.PacingOptions(join_while_covering=join))
    offered = []
    real = stream_mod.Stream._admit_next
    monkeypatch.setattr(stream_mod.Stream, "_admit_next",
                        lambda self, sentence, until, n: offered.append(until) or real(self, sentence, until, n))
    list(engine.synthesize_stream(MULTI, seed=5, playing_until=time.perf_counter() + 60, **KW))
    assert offered, "no token was decoded"
    if join:
        assert any(u is not None for u in offered), "the plan lets them join, but none was offered"
    else:
        assert all(u is None for u in offered), "a waiting sentence was offered a covering decode"
