"""engine/stream.py: one streamed request as an object, the caller's listener (queue and playback) as one argument,
and the first chunk of a text of several sentences by ``PRIMESPEECH_STREAM_START`` (gapless or earliest).

Windows are counted in tokens (``Stream.windows``), never timed: the pacer is given fixed speeds and lengths, so its
plan does not depend on this machine."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_engine import GenerateSpy, case, model_dir, voice  # noqa: F401  (shared fixtures)
from test_engine import engine as engine  # noqa: F401,F811

from dora_primespeech_mlx.engine import batching, core, pacing, pipeline
from dora_primespeech_mlx.engine.stream import NO_SCHEDULE, Schedule, Stream
from dora_primespeech_mlx.errors import ConfigError

MULTI = "Hello world, this is a small test. The second sentence comes next. And a third one follows it now."
KW = {"text_split_method": "cut5", "top_k": 5, "seed": 5, "speed_factor": 1.0}
NEAR = (0.0155, 0.0105, 0.08)  # token_s, frame_s, latent_s: a machine a little faster than real time (the pacer
EXPECTED = 100  # covers: tests/engine/test_pacing.py), and the sentences' expected length in tokens


def fixed_rates(token_s: float, frame_s: float, latent_s: float, expected: int) -> pacing.StreamRates:
    """Rates with these speeds and every sentence expected at ``expected`` tokens, which the stream's own
    measurements leave unchanged (the plan is then the same on any machine)."""
    r = pacing.StreamRates()
    r.note_tokens(token_s, 1)
    r.note_vocoder(frame_s, 1)
    r.note_latent(latent_s, window=True)
    for name in ("note_tokens", "note_step", "note_vocoder", "note_latent", "note_window", "note_start",
                 "note_length", "live_ratio"):
        setattr(r, name, lambda *a, **k: None)
    r.expected_tokens = lambda name, phones: expected
    return r


@pytest.fixture
def streams(monkeypatch) -> list[Stream]:
    """Every Stream the engine builds, in order."""
    built = []

    class Recorded(Stream):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            built.append(self)

    monkeypatch.setattr(core, "Stream", Recorded)
    return built


def _sentences(engine, text) -> list[pipeline.TextChunk]:
    return pipeline.text_chunks(text, engine.voice.language, "cut5", engine.voice, engine.store.models(engine.voice),
                                pipeline.Timer(), data=engine.text_data)


def _stream(engine, monkeypatch, text: str, start: str, streams: list[Stream]) -> tuple[Stream, list, dict]:
    """Stream ``text`` with the settings' ``start``: (its Stream, its chunks, its tokens by sentence)."""
    monkeypatch.setattr(engine, "settings", dataclasses.replace(engine.settings, stream_start=start))
    spy = GenerateSpy(monkeypatch)
    chunks = list(engine.synthesize_stream(text, **KW))
    return streams[-1], chunks, [spy.tokens[k] for k in sorted(spy.tokens)]


def test_earliest_start_cuts_the_first_chunk_no_later_than_the_first_sentence_alone(engine, monkeypatch, streams):
    """PRIMESPEECH_STREAM_START=earliest: the first chunk of a text of several sentences comes after no more tokens
    than that of a stream of its first sentence alone (the later sentences do not make it wait), where gapless may
    wait for more (its first piece covers the later sentences' starts); the tokens and the audio's length are the
    whole synthesis's either way."""
    chunks_of_text = _sentences(engine, MULTI)
    if len(chunks_of_text) < 2:
        pytest.skip("the front end gives one sentence for the text with this voice")
    engine.batching.drop_joined()
    monkeypatch.setattr(engine, "rates", fixed_rates(*NEAR, EXPECTED))
    whole = engine.synthesize(MULTI, **KW)

    earliest, chunks, tokens = _stream(engine, monkeypatch, MULTI, "earliest", streams)
    first_alone = chunks_of_text[0].norm_text
    alone, _, alone_tokens = _stream(engine, monkeypatch, first_alone, "earliest", streams)
    gapless, gapless_chunks, gapless_tokens = _stream(engine, monkeypatch, MULTI, "gapless", streams)

    assert alone_tokens[0] == tokens[0], "the first sentence alone is not the text's first sentence"
    assert earliest.windows[0][0] == 0 and alone.windows[0][0] == 0
    assert earliest.windows[0][1] <= alone.windows[0][1], (earliest.windows, alone.windows)
    assert gapless.windows[0][1] >= earliest.windows[0][1], (gapless.windows, earliest.windows)
    if len(tokens[0]) > earliest.windows[0][1]:  # (gapless covers three sentences of EXPECTED tokens: it waits)
        assert gapless.windows[0][1] > earliest.windows[0][1], (gapless.windows, earliest.windows)
    assert sum(n for s, n in earliest.windows if s == 0) == len(tokens[0])  # windows count every token
    for got, got_chunks in ((tokens, chunks), (gapless_tokens, gapless_chunks)):
        np.testing.assert_array_equal(np.concatenate(got), whole.semantic_tokens)
        assert sum(len(c.audio) for c in got_chunks) == len(whole.audio)


def test_earliest_start_plans_as_gapless_where_the_caller_s_audio_is_still_playing(engine, monkeypatch, streams):
    """With the caller's earlier audio in hand (``playing_until`` ahead) nobody waits for the first words: earliest
    cuts the windows gapless cuts (one row per step, so that no sentence joins and every cut is the plan's)."""
    import time

    if len(_sentences(engine, MULTI)) < 2:
        pytest.skip("the front end gives one sentence for the text with this voice")
    engine.batching.drop_joined()
    monkeypatch.setattr(engine, "rates", fixed_rates(*NEAR, EXPECTED))
    windows = {}
    for start in ("earliest", "gapless"):
        monkeypatch.setattr(engine, "settings", dataclasses.replace(engine.settings, stream_start=start, batch=1))
        list(engine.synthesize_stream(MULTI, playing_until=time.perf_counter() + 600.0, **KW))
        windows[start] = streams[-1].windows
    assert windows["earliest"] == windows["gapless"]


def test_pacing_options_follow_the_settings_unless_the_engine_has_a_plan(engine, monkeypatch):
    monkeypatch.setattr(engine, "settings", dataclasses.replace(engine.settings, stream_start="earliest"))
    assert engine.pacing_options() == pacing.PacingOptions(start="earliest")
    options = engine.pacing_options()
    assert not options.plans_ahead(0) and options.plans_ahead(1) and options.plans_ahead(0, waiting=False)
    monkeypatch.setattr(engine, "pacing_plan", pacing.PacingOptions(taper=False))
    assert engine.pacing_options() == pacing.PacingOptions(taper=False)
    assert pacing.PacingOptions().plans_ahead(0)
    with pytest.raises(ConfigError, match="PRIMESPEECH_STREAM_START"):
        pacing.PacingOptions(start="soon")


class Queue:
    """A listener as a caller may keep one: its live queue and playback."""

    def __init__(self, key, texts, until):
        self.key, self.texts, self.until, self.asked = key, texts, until, 0

    def upcoming(self):
        self.asked += 1
        return list(self.texts)

    def playing_until(self):
        return self.until


def test_a_listener_object_and_the_separate_keywords_are_the_same_stream(engine, monkeypatch, streams):
    """``synthesize_stream(listener=...)`` and ``key=`` / ``upcoming=`` / ``playing_until=`` give the same request:
    the queue is asked, the playback time is the plan's first deadline, the audio is the same; both at once, or a
    playback time that is not a number, are refused at the call."""
    import time

    monkeypatch.setattr(batching, "UPCOMING_EVERY_S", 0.0)
    kw = {**KW, "stream_pace": False}
    until = time.perf_counter() + 60.0
    queue = Queue("k", [], until)
    a = list(engine.synthesize_stream(MULTI, listener=queue, **kw))
    assert queue.asked >= 1 and streams[-1].listener is queue and streams[-1].playing_until == until
    asked = []
    b = list(engine.synthesize_stream(MULTI, key="k", upcoming=lambda: asked.append(1) or [], playing_until=until,
                                      **kw))
    assert asked and streams[-1].listener == Schedule("k", streams[-1].listener.texts, until)
    np.testing.assert_array_equal(np.concatenate([c.audio for c in a]), np.concatenate([c.audio for c in b]))
    list(engine.synthesize_stream("Hello.", **kw))
    assert streams[-1].listener is NO_SCHEDULE
    with pytest.raises(TypeError, match="listener"):
        engine.synthesize_stream(MULTI, listener=queue, key="k", **kw)
    with pytest.raises(ValueError, match="playing_until"):
        engine.synthesize_stream(MULTI, listener=Queue(None, [], float("nan")), **kw)
