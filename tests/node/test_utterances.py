"""Streamed utterances (``text`` fragments with ``segment_id``, dora's streaming convention) and barge-in
(``flush: true``) through the handler, with a fake engine and a recording transport: fragments joined in ``seq``
order and spoken sentence by sentence (each sentence a text of its own), the LLM stage fed off the input thread,
one ``segment_complete`` per utterance, audio ``seq``/``fin``, the idle wait, and a barge-in that stops the
audio being made and marks the next audio ``flush``."""

from __future__ import annotations

import json
import random
import threading
import time
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_reliability import FakeEngine, Result, make

from dora_primespeech_mlx.dataflow.handler import CANCELLED, FLUSHED
from dora_primespeech_mlx.text import llm

ANSWER = "Hello there. How are you today? I am fine, thanks! See you soon."
SENTENCES = ["Hello there.", "How are you today?", "I am fine, thanks!", "See you soon."]


def audio_for(text: str) -> np.ndarray:
    """Deterministic samples for a text, so a test can tell which text a chunk came from."""
    rng = np.random.default_rng(abs(hash(text)) % (2**32))
    return rng.uniform(-0.5, 0.5, 40 + 3 * len(text)).astype(np.float32)


class TextEngine(FakeEngine):
    """Records the texts it is asked for (and the thread), speaks ``audio_for(text)``; with ``gate`` it blocks in
    each text until the gate opens or the text is cancelled."""

    def __init__(self, gate: threading.Event | None = None):
        super().__init__(gate=gate)
        self.texts: list[str] = []
        self.cancelled: list[tuple[str, float]] = []

    def synthesize(self, text, voice=None, cancel=None, **kw):
        self.texts.append(text)
        try:
            self._wait(cancel)
        except Exception:
            self.cancelled.append((text, time.perf_counter()))
            raise
        return Result(audio_for(text))

    def synthesize_stream(self, text, voice=None, cancel=None, **kw):
        self.texts.append(text)
        samples = audio_for(text)
        parts = np.array_split(samples, 3)

        def gen():
            for i, part in enumerate(parts):
                self._wait(cancel)
                yield SimpleNamespace(audio=part, sample_rate=32000, chunk_index=i, is_final=i == len(parts) - 1)

        return gen()


def cut(text: str, rng: random.Random, lo: int = 2, hi: int = 5) -> list[str]:
    out, i = [], 0
    while i < len(text):
        k = rng.randint(lo, hi)
        out.append(text[i:i + k])
        i += k
    return out


def stream(handler, fragments, segment=1, session="s1", order=None, fin=True, first_seq=0, **extra):
    """Send ``fragments`` as one utterance (``order``: the order of their indices on the wire)."""
    idx = list(range(len(fragments))) if order is None else order
    for n, i in enumerate(idx):
        md = {"session_id": session, "segment_id": segment, "seq": first_seq + i, "question_id": f"q{segment}"}
        if fin and i == len(fragments) - 1:
            md["fin"] = True
        if n == 0:
            md.update(extra)
        handler.on_input("text", pa.array([fragments[i]]), md)


def of_segment(rec, output, segment):
    return [(a, m) for a, m in rec.of(output) if m.get("segment_id") == segment]


def test_fragments_are_spoken_sentence_by_sentence_with_one_answer():
    engine = TextEngine()
    handler, rec = make(engine)
    try:
        stream(handler, cut(ANSWER, random.Random(1)))
        rec.wait(lambda r: len(r.of("segment_complete")) == 1)
        assert engine.texts == SENTENCES
        (value, md), = rec.of("segment_complete")
        assert value.to_pylist() == ["completed"]
        assert (md["session_id"], md["segment_id"], md["question_id"]) == ("s1", 1, "q1")
        assert "seq" not in md and "fin" not in md and "flush" not in md
        audio = rec.of("audio")
        assert [m["seq"] for _, m in audio] == list(range(len(SENTENCES)))
        assert [m["fin"] for _, m in audio] == [False] * (len(SENTENCES) - 1) + [True]
        assert all(m["segment_id"] == 1 and m["session_id"] == "s1" and "flush" not in m for _, m in audio)
        for (array, _), sentence in zip(audio, SENTENCES):
            assert np.array_equal(np.asarray(array[0].as_py(), np.float32), audio_for(sentence))
        statuses = rec.statuses()
        assert [s["sentence"] for s in statuses if s["status"] == "synthesizing"] == [0, 1, 2, 3]
        assert [s["sentence"] for s in statuses if s["status"] == "done"] == [0, 1, 2, 3]
        assert handler.counts["texts"] == 1 and handler.counts["completed"] == 1
    finally:
        handler.stop()


def test_streamed_chunks_number_across_sentences():
    engine = TextEngine()
    handler, rec = make(engine, STREAMING="true")
    try:
        stream(handler, cut(ANSWER, random.Random(2)))
        rec.wait(lambda r: len(r.of("segment_complete")) == 1)
        audio = rec.of("audio")
        assert [m["seq"] for _, m in audio] == list(range(3 * len(SENTENCES)))
        assert [i for i, (_, m) in enumerate(audio) if m["fin"]] == [len(audio) - 1]
        assert [m["chunk_index"] for _, m in audio] == [0, 1, 2] * len(SENTENCES)  # per sentence, as before
    finally:
        handler.stop()


def test_the_first_sentence_is_spoken_before_the_utterance_ends():
    engine = TextEngine()
    handler, rec = make(engine)
    try:
        fragments = cut(ANSWER, random.Random(3))
        head = [f for f in fragments]
        stream(handler, head[: len(head) // 2], fin=False)
        rec.wait(lambda r: len(r.of("audio")) >= 1)
        assert engine.texts[0] == "Hello there." and not rec.of("segment_complete")
        assert rec.of("audio")[0][1]["fin"] is False
    finally:
        handler.stop()


def test_fragments_out_of_order_are_put_back_in_seq_order():
    engine = TextEngine()
    handler, rec = make(engine)
    try:
        fragments = cut(ANSWER, random.Random(4))
        order = list(range(len(fragments)))
        rng = random.Random(5)
        for i in range(0, len(order) - 3, 3):  # swap neighbours: late and early fragments
            order[i], order[i + 2] = order[i + 2], order[i]
        stream(handler, fragments, order=order)
        rec.wait(lambda r: len(r.of("segment_complete")) == 1)
        assert engine.texts == SENTENCES
        rng.shuffle(order)
        stream(handler, fragments, segment=2, order=order)
        rec.wait(lambda r: len(r.of("segment_complete")) == 2)
        assert engine.texts == SENTENCES * 2
    finally:
        handler.stop()


def test_llm_stage_runs_on_the_joined_fragments_off_the_input_thread(monkeypatch):
    threads = set()
    feed = llm.StreamFilter.feed

    def recording_feed(self, text):
        threads.add(threading.current_thread().name)
        return feed(self, text)

    monkeypatch.setattr(llm.StreamFilter, "feed", recording_feed)
    engine = TextEngine()
    handler, rec = make(engine)
    try:
        text = ("<think>The user greets me. I will answer.</think>**Hello** there. Here is how:\n"
                "1. Update numpy\n2. Restart the server\n```python\nprint('no.')\n```\nThat is all.")
        stream(handler, cut(text, random.Random(6)))
        rec.wait(lambda r: len(r.of("segment_complete")) == 1)
        assert engine.texts == ["Hello there.", "Here is how:", "Update numpy", "Restart the server",
                                "That is all."]
        assert threads == {"primespeech-intake"}
        # the same text given whole speaks the same sentences
        engine.texts.clear()
        stream(handler, [text], segment=2)
        rec.wait(lambda r: len(r.of("segment_complete")) == 2)
        assert engine.texts == ["Hello there.", "Here is how:", "Update numpy", "Restart the server",
                                "That is all."]
    finally:
        handler.stop()


def test_an_utterance_with_nothing_to_speak_is_skipped_once():
    engine = TextEngine()
    handler, rec = make(engine)
    try:
        stream(handler, cut("<think>Only thinking here. Nothing else.</think>", random.Random(7)))
        rec.wait(lambda r: len(r.of("segment_complete")) == 1)
        assert engine.texts == []
        (value, md), = rec.of("segment_complete")
        assert value.to_pylist() == ["skipped"] and md["segment_id"] == 1
        (_, amd), = rec.of("audio")  # SILENCE_ON_SKIP: one silent chunk, ending the segment
        assert amd["silent"] is True and amd["fin"] is True and amd["seq"] == 0
    finally:
        handler.stop()


def test_the_idle_wait_ends_an_utterance_without_fin():
    engine = TextEngine()
    handler, rec = make(engine, PRIMESPEECH_SEGMENT_IDLE_S="0.3")
    try:
        stream(handler, cut("Hello there. And then", random.Random(8)), fin=False)
        rec.wait(lambda r: len(r.of("segment_complete")) == 1)
        assert engine.texts == ["Hello there.", "And then"]
        audio = rec.of("audio")
        assert [m["seq"] for _, m in audio] == [0, 1] and [m["fin"] for _, m in audio] == [False, True]
    finally:
        handler.stop()


def test_fin_after_the_last_audio_sends_a_closing_chunk():
    engine = TextEngine()
    handler, rec = make(engine)
    try:
        stream(handler, ["Hello there. "], fin=False)
        rec.wait(lambda r: len(r.of("audio")) == 1)
        handler.on_input("text", pa.array([""]), {"session_id": "s1", "segment_id": 1, "seq": 1, "fin": True})
        rec.wait(lambda r: len(r.of("segment_complete")) == 1)
        audio = rec.of("audio")
        assert [(m["seq"], m["fin"], m.get("silent", False)) for _, m in audio] == [(0, False, False), (1, True, True)]
        assert rec.of("segment_complete")[0][0].to_pylist() == ["completed"]
    finally:
        handler.stop()


def test_plain_texts_keep_their_answers_and_drop_seq_from_audio():
    engine = TextEngine()
    handler, rec = make(engine)
    try:
        handler.on_input("text", pa.array(["One. Two."]), {"seq": 7, "question_id": "p"})
        rec.wait(lambda r: len(r.of("segment_complete")) == 1)
        assert engine.texts == ["One. Two."]  # a text without segment_id is one text, as always
        (_, amd), = rec.of("audio")
        assert "seq" not in amd and "fin" not in amd and amd["question_id"] == "p"
        assert rec.of("segment_complete")[0][1]["seq"] == 7  # the answer echoes the input's metadata
    finally:
        handler.stop()


def test_barge_in_stops_the_audio_and_cancels_what_was_sent_before():
    gate = threading.Event()
    engine = TextEngine(gate=gate)
    handler, rec = make(engine)
    try:
        handler.on_input("text", pa.array(["A plain text first."]), {"question_id": "plain"})
        stream(handler, cut(ANSWER, random.Random(9)))
        assert engine.started.wait(5)
        t0 = time.perf_counter()
        stream(handler, ["Stop. ", "New answer."], segment=2, flush=True)
        assert time.perf_counter() - t0 < 0.1  # the input thread never waits for the engine
        deadline = time.monotonic() + 5
        while not engine.cancelled and time.monotonic() < deadline:
            time.sleep(0.005)
        gate.set()
        rec.wait(lambda r: any(m.get("segment_id") == 2 for _, m in r.of("segment_complete")))
        (text, at), = engine.cancelled
        assert text == "A plain text first." and at - t0 < 0.1  # the text being made stopped within 100 ms
        done = rec.of("segment_complete")
        assert [(m.get("question_id"), a.to_pylist()[0]) for a, m in done] == [
            ("plain", "error"), ("q1", "error"), ("q2", "completed")]
        assert done[0][1]["error"] == FLUSHED and done[1][1]["error_stage"] == "flush"
        assert not of_segment(rec, "audio", 1), "no audio of the old segment"
        audio = rec.of("audio")
        assert audio[0][1]["flush"] is True and all("flush" not in m for _, m in audio[1:])
        assert [m["segment_id"] for _, m in audio] == [2, 2] and [m["seq"] for _, m in audio] == [0, 1]
        (flush,) = [s for s in rec.statuses() if s["status"] == "flush"]
        assert flush["cancelled"] == 2
        assert engine.texts[-2:] == ["Stop.", "New answer."]
        # late fragments of the cancelled segment are dropped
        handler.on_input("text", pa.array(["More old text."]), {"session_id": "s1", "segment_id": 1, "seq": 99})
        assert handler.wait_idle(5)
        assert len(rec.of("segment_complete")) == 3
    finally:
        gate.set()
        handler.stop()


def test_flush_on_control_and_reset_keep_their_meaning():
    gate = threading.Event()
    engine = TextEngine(gate=gate)
    handler, rec = make(engine)
    try:
        stream(handler, cut(ANSWER, random.Random(10)))
        assert engine.started.wait(5)
        handler.on_input("control", pa.array([""]), {"flush": True})  # a bare barge-in: no command, no error
        rec.wait(lambda r: len(r.of("segment_complete")) == 1)
        assert rec.of("segment_complete")[0][1]["error"] == FLUSHED
        assert not [s for s in rec.statuses() if s["status"] == "error"]
        gate.set()
        handler.on_input("text", pa.array(["After."]), {"question_id": "after"})
        rec.wait(lambda r: len(r.of("segment_complete")) == 2)
        assert rec.of("audio")[-1][1]["flush"] is True  # the next audio after the barge-in
        # reset cancels an utterance as one text
        gate.clear()
        stream(handler, cut(ANSWER, random.Random(11)), segment=3)
        rec.wait(lambda r: len(engine.texts) >= 2 + 1)
        handler.on_input("control", pa.array(["reset"]), {})
        rec.wait(lambda r: len(r.of("segment_complete")) == 3)
        (reset,) = [s for s in rec.statuses() if s["status"] == "reset"]
        assert reset["cancelled"] == 1 and rec.of("segment_complete")[-1][1]["error"] == CANCELLED
    finally:
        gate.set()
        handler.stop()


def test_stop_answers_an_open_utterance_once():
    gate = threading.Event()
    engine = TextEngine(gate=gate)
    handler, rec = make(engine)
    stream(handler, cut(ANSWER, random.Random(12)), fin=False)
    assert engine.started.wait(5)
    assert handler.stop() == 1
    (value, md), = rec.of("segment_complete")
    assert value.to_pylist() == ["error"] and md["error_stage"] == "stop"


def test_finish_speaks_the_rest_of_an_open_utterance():
    engine = TextEngine()
    handler, rec = make(engine)
    stream(handler, cut("Hello there. And the rest", random.Random(13)), fin=False)
    assert handler.finish(10)
    assert engine.texts == ["Hello there.", "And the rest"]
    assert [a.to_pylist() for a, _ in rec.of("segment_complete")] == [["completed"]]


def test_an_utterance_still_in_the_intake_is_answered_by_a_barge_in():
    """Fragments that reached the node but not yet the intake thread when a barge-in comes: their utterance is
    cancelled and answered once, like one already being assembled."""
    engine = TextEngine()
    handler, rec = make(engine)
    try:
        with handler.intake.hold():  # the intake thread takes nothing meanwhile
            stream(handler, cut(ANSWER, random.Random(14)), fin=False)
            stream(handler, ["New answer."], segment=2, flush=True)
        rec.wait(lambda r: len(r.of("segment_complete")) == 2)
        first, second = rec.of("segment_complete")
        assert first[1]["segment_id"] == 1 and first[1]["error"] == FLUSHED
        assert second[1]["segment_id"] == 2 and second[0].to_pylist() == ["completed"]
        assert engine.texts == ["New answer."]
        (flush,) = [s for s in rec.statuses() if s["status"] == "flush"]
        assert flush["cancelled"] == 1
    finally:
        handler.stop()


EVENTS = st.lists(st.one_of(
    st.tuples(st.just("text"), st.text(alphabet="ab. ", max_size=8)),
    st.tuples(st.just("fragment"), st.text(alphabet="ab. !\n", max_size=5)),
    st.tuples(st.just("fin"), st.text(alphabet="ab.", max_size=3)),
    st.tuples(st.just("flush"), st.text(alphabet="ab. ", max_size=5)),
    st.tuples(st.just("reset"), st.just("")),
), max_size=40)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=EVENTS, seed=st.integers(0, 2**16))
def test_every_text_and_utterance_is_answered_once_whatever_happens(events, seed):
    """Random interleavings of plain texts, fragments, fins, barge-ins and resets with an engine that fails at
    random: one answer per plain text and per utterance, none for a fragment; no audio of an utterance after its
    answer; the first audio after a barge-in carries flush."""
    engine = FakeEngine(random.Random(seed), fail_rate=0.2)
    handler, rec = make(engine, PRIMESPEECH_SEGMENT_IDLE_S="0.2")
    texts, segments, segment, n = [], set(), 0, 0
    for kind, body in events:
        if kind == "text":
            texts.append(f"t{len(texts)}")
            handler.on_input("text", pa.array([body]), {"tid": texts[-1]})
            continue
        if kind == "reset":
            handler.on_input("control", pa.array(["reset"]), {})
            continue
        md = {"session_id": "s", "seq": n}
        if kind == "flush" or segment == 0:
            segment, n = segment + 1, 0
            md["seq"] = 0
            md["flush"] = kind == "flush"
        md["segment_id"] = segment
        md["fin"] = kind == "fin"
        segments.add(segment)
        handler.on_input("text", pa.array([body]), md)
        n += 1
        if kind == "fin":
            segment, n = segment + 1, 0  # the next fragment starts a new segment
    assert handler.finish(30)
    answers = rec.of("segment_complete")
    tids = [m["tid"] for _, m in answers if "tid" in m]
    assert sorted(tids) == sorted(texts)
    seg_answers = [m["segment_id"] for _, m in answers if "segment_id" in m]
    assert len(seg_answers) == len(set(seg_answers)) and set(seg_answers) == segments
    with rec.cv:
        sent = list(rec.sent)
    answered_at = {m["segment_id"]: i for i, (o, _, m) in enumerate(sent) if o == "segment_complete"
                   and "segment_id" in m}
    for i, (o, _, m) in enumerate(sent):
        if o == "audio" and "segment_id" in m:
            assert i < answered_at[m["segment_id"]], "audio after its utterance's answer"
    flushes = [i for i, (o, a, _) in enumerate(sent) if o == "status" and json.loads(a[0].as_py())["status"] == "flush"]
    for at in flushes:
        later = [m for o, _, m in sent[at:] if o == "audio"]
        if later:
            assert later[0].get("flush") is True


def test_each_text_is_checked_and_its_voice_resolved_once(monkeypatch):
    """The speakable/length checks run once per text (when it is admitted) and its voice is resolved once, also
    when the queue changes again and again and the engine reads the queued texts again and again (continuous
    batching: the board the speaker publishes them to, ``listener.upcoming()``)."""
    from dora_primespeech_mlx.dataflow import admission

    checks, resolved = [], []
    real_check = admission.has_speakable
    monkeypatch.setattr(admission, "has_speakable", lambda text: checks.append(text) or real_check(text))

    class Batching(TextEngine):
        def synthesize_stream(self, text, voice=None, cancel=None, listener=None, **kw):
            for _ in range(5):
                listener.upcoming()  # the engine looks at the queue at every step
            return super().synthesize_stream(text, voice, cancel, **kw)

    gate = threading.Event()
    engine = Batching(gate=gate)
    handler, rec = make(engine, STREAMING="true")
    real_voice = handler.voices.for_request
    monkeypatch.setattr(handler.voices, "for_request", lambda req, st=None: resolved.append(req.text)
                        or real_voice(req, st))
    try:
        for i in range(4):
            handler.on_input("text", pa.array([f"Text number {i}."]), {"i": i})
        stream(handler, cut(ANSWER, random.Random(15)))
        assert engine.started.wait(5)
        assert handler.wait_idle(0.5) is False  # the first text holds the worker
        time.sleep(0.2)
        gate.set()
        rec.wait(lambda r: len(r.of("segment_complete")) == 5)
        spoken = [f"Text number {i}." for i in range(4)] + SENTENCES
        assert sorted(checks) == sorted(spoken) and sorted(resolved) == sorted(spoken)
    finally:
        gate.set()
        handler.stop()


def test_a_segment_that_goes_on_after_its_idle_wait_is_a_new_utterance_in_seq_order():
    engine = TextEngine()
    handler, rec = make(engine, PRIMESPEECH_SEGMENT_IDLE_S="0.3")
    try:
        first = cut("Hello there. And", random.Random(16))
        stream(handler, first, fin=False)
        rec.wait(lambda r: len(r.of("segment_complete")) == 1)
        stream(handler, cut(" more words. Done.", random.Random(17)), first_seq=len(first))
        rec.wait(lambda r: len(r.of("segment_complete")) == 2)
        logs = [json.loads(a[0].as_py())["message"] for a, _ in rec.of("log")]
        # the second part ended at its fin: its fragments were not held back as out of order until the idle wait
        assert sum("no fragment for" in m for m in logs) == 1 and not [m for m in logs if "gap" in m]
        assert engine.texts == ["Hello there.", "And", "more words.", "Done."]
        assert [m["segment_id"] for _, m in rec.of("segment_complete")] == [1, 1]
    finally:
        handler.stop()


def test_a_repeated_fragment_after_fin_is_dropped():
    engine = TextEngine()
    handler, rec = make(engine, PRIMESPEECH_SEGMENT_IDLE_S="0.2")
    try:
        fragments = cut(ANSWER, random.Random(18))
        stream(handler, fragments)
        rec.wait(lambda r: len(r.of("segment_complete")) == 1)
        handler.on_input("text", pa.array([fragments[3]]), {"session_id": "s1", "segment_id": 1, "seq": 3})
        time.sleep(0.5)  # past the idle wait: a phantom utterance would be answered by now
        assert handler.wait_idle(5) and len(rec.of("segment_complete")) == 1 and engine.texts == SENTENCES
    finally:
        handler.stop()


def test_a_cancel_of_one_session_leaves_the_other_speaking():
    """``control`` ``cancel`` with a ``session_id``: that session's utterance being spoken stops, its queued texts
    are answered cancelled (each once, with what went out), the other session's texts are spoken whole; no audio is
    marked ``flush``; ``stats`` counts per session. ``cancel`` without a session is an error, ``cancel:NAME``
    names one."""
    from dora_primespeech_mlx.dataflow.messages import ControlCommand, parse_control

    assert parse_control("cancel:room 2") == ControlCommand("cancel", "room 2")
    gate = threading.Event()
    engine = TextEngine(gate=gate)
    handler, rec = make(engine)
    try:
        stream(handler, cut(ANSWER, random.Random(20)), segment=1, session="A")
        assert engine.started.wait(5)
        handler.on_input("text", pa.array(["A plain text of A."]), {"session_id": "A", "question_id": "a2"})
        stream(handler, ["One. ", "Two."], segment=2, session="B")
        handler.on_input("text", pa.array(["A plain text of B."]), {"session_id": "B", "question_id": "b2"})
        handler.on_input("control", pa.array(["cancel"]), {})  # no session: an error, nothing cancelled
        handler.on_input("control", pa.array(["cancel"]), {"session_id": "A"})
        rec.wait(lambda r: len(r.of("segment_complete")) == 2)
        deadline = time.monotonic() + 5
        while not engine.cancelled and time.monotonic() < deadline:
            time.sleep(0.005)
        gate.set()
        rec.wait(lambda r: len(r.of("segment_complete")) == 4)
        assert handler.wait_idle(5)
        done = [(m.get("session_id"), str(m.get("segment_id", m.get("question_id"))), a.to_pylist()[0],
                 m.get("error_stage")) for a, m in rec.of("segment_complete")]
        assert sorted(done[:2]) == [("A", "1", "error", "cancel"), ("A", "a2", "error", "cancel")]
        assert done[2:] == [("B", "2", "completed", None), ("B", "b2", "completed", None)]
        assert engine.cancelled and engine.cancelled[0][0] == SENTENCES[0]  # the sentence being made stopped
        audio = [m for _, m in rec.of("audio")]
        assert all(m["session_id"] == "B" for m in audio) and not any("flush" in m for m in audio)
        assert "".join(m["text"] for m in audio if m.get("segment_id") == 2).split() == ["One.", "Two."]
        statuses = rec.statuses()
        (cancel,) = [s for s in statuses if s["status"] == "cancel"]
        assert cancel["cancelled"] == 2 and cancel["session"] == "A"
        assert any(s["status"] == "error" and s.get("command") == "cancel" for s in statuses)
        (a1,) = [m for _, m in rec.of("segment_complete") if m.get("segment_id") == 1]
        assert a1["spoken_text"] == "" and a1["audio_sent_s"] == 0
        handler.on_input("control", pa.array(["stats"]), {})
        (stats,) = [s for s in rec.statuses() if s["status"] == "stats"]
        assert stats["sessions"]["A"]["cancelled"] == 2 and stats["sessions"]["A"]["audio_s"] == 0
        assert stats["sessions"]["B"]["completed"] == 2 and stats["sessions"]["B"]["audio_s"] > 0
        # a late fragment of the cancelled utterance is dropped; the session speaks again afterwards
        handler.on_input("text", pa.array(["More."]), {"session_id": "A", "segment_id": 1, "seq": 99})
        stream(handler, ["Back again."], segment=3, session="A")
        rec.wait(lambda r: len(r.of("segment_complete")) == 5)
        assert rec.of("segment_complete")[-1][1]["segment_id"] == 3
    finally:
        gate.set()
        handler.stop()


def test_the_chunks_text_tiles_an_utterance_also_past_a_sentence_with_nothing_to_speak():
    """A sentence of an utterance that gives no audio (only marks: skipped) goes with the next one spoken: the
    chunks' ``text`` joined is the utterance's spoken text, each chunk's ``text_start`` where the one before it
    ended."""
    engine = TextEngine()
    handler, rec = make(engine)
    try:
        stream(handler, cut("Hello there. … See you soon. ", random.Random(21)))
        rec.wait(lambda r: len(r.of("segment_complete")) == 1)
        assert handler.wait_idle(5)
        assert engine.texts == ["Hello there.", "See you soon."]
        audio = [m for _, m in rec.of("audio")]
        at = 0
        for md in audio:
            assert md["text_start"] == at
            at += len(md["text"])
        assert [md["text"] for md in audio] == ["Hello there.", " … See you soon."]
    finally:
        handler.stop()
