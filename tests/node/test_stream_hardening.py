"""A token stream as a hostile or careless sender sends it, through the handler with a fake engine and a recording
transport (issue 50): reasoning never spoken across an idle end, an eviction or a new utterance of its segment
(form 1); a timestamp from the future cannot mute the node, and a fragment sent before a barge-in that arrives
after it is answered (form 2); negative, huge and non-integer ``seq`` values lose no utterance (form 3); every
byte of a message is bounded (form 4); cancelled utterances are remembered by time, not by a count a sender can
exhaust (form 8); and, whatever the timestamps and ``seq`` values, every text and utterance is answered exactly
once (property)."""

from __future__ import annotations

import datetime as dt
import json
import time

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_reliability import FakeEngine, make
from test_utterances import TextEngine

from dora_primespeech_mlx.dataflow.handler import FLUSHED
from dora_primespeech_mlx.dataflow.intake import MAX_OPEN
from dora_primespeech_mlx.dataflow.streams import Filters

REASONING = "想"  # every reasoning line below has it, no answer has it


def logs(rec, level=None):
    out = [json.loads(a[0].as_py()) for a, _ in rec.of("log")]
    return [m["message"] for m in out if level is None or m["level"] == level]


def frag(handler, text, session="s", segment=1, seq=None, **md):
    meta = {"session_id": session, "segment_id": segment, **md}
    if seq is not None:
        meta["seq"] = seq
    handler.on_input("text", pa.array([text]), meta)


def answers_of(rec, session, segment):
    return [(a.to_pylist()[0], m) for a, m in rec.of("segment_complete")
            if m.get("session_id") == session and m.get("segment_id") == segment]


def now(offset_s: float = 0.0) -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=offset_s)


# -- form 1: the LLM filter belongs to the segment ----------------------------------------------------------------
def test_reasoning_open_across_the_idle_end_is_not_spoken():
    engine = TextEngine()
    handler, rec = make(engine, PRIMESPEECH_SEGMENT_IDLE_S="0.2")
    try:
        frag(handler, "<think>\n让我想一想。", seq=0)
        rec.wait(lambda r: len(r.of("segment_complete")) == 1)  # the idle wait ended the first utterance
        frag(handler, "我再想想二加二。", seq=1)
        frag(handler, "</think>\n答案是四。", seq=2, fin=True)
        rec.wait(lambda r: len(r.of("segment_complete")) == 2)
        assert handler.wait_idle(5)
        assert engine.texts == ["答案是四。"]
        assert [a for a, _ in answers_of(rec, "s", 1)] == ["skipped", "completed"]  # one per utterance
    finally:
        handler.stop()


def test_reasoning_open_when_its_utterance_is_ended_to_make_room_is_not_spoken():
    engine = TextEngine()
    handler, rec = make(engine, PRIMESPEECH_SEGMENT_IDLE_S="30")
    try:
        frag(handler, "<think>\n让我想一想。", seq=0)
        frag(handler, "还在想", seq=1)  # held: no sentence end yet
        for segment in range(2, MAX_OPEN + 2):  # the oldest utterance (segment 1) is ended
            frag(handler, "Hi.", segment=segment, seq=0)
        rec.wait(lambda r: len(answers_of(r, "s", 1)) == 1)
        frag(handler, "我想好了。</think>\n答案是四。", seq=2, fin=True)
        rec.wait(lambda r: len(answers_of(r, "s", 1)) == 2)
        assert handler.finish(10)
        assert not [t for t in engine.texts if REASONING in t]
        assert "答案是四。" in engine.texts
        warnings = [m for m in logs(rec, "WARNING") if f"more than {MAX_OPEN} utterances open" in m]
        assert "segment '1'" in warnings[0] and "discarded" in warnings[0]  # one WARNING per utterance ended
        assert len(rec.of("segment_complete")) == MAX_OPEN + 2  # each utterance once
    finally:
        handler.stop()


def test_a_plain_text_sessions_reasoning_survives_64_other_sessions():
    engine = TextEngine()
    handler, rec = make(engine)
    try:
        handler.on_input("text", pa.array(["<think>\n让我想一想。"]), {"session_id": "a", "question_id": "1"})
        for n in range(70):
            handler.on_input("text", pa.array(["Hello."]), {"session_id": f"other{n}", "question_id": "1"})
        handler.on_input("text", pa.array(["我还在想。"]), {"session_id": "a", "question_id": "1"})
        handler.on_input("text", pa.array(["</think>\n答案是四。"]), {"session_id": "a", "question_id": "1"})
        rec.wait(lambda r: len(r.of("segment_complete")) == 73)
        assert not [t for t in engine.texts if REASONING in t]
        assert engine.texts[-1] == "答案是四。"
    finally:
        handler.stop()


def test_an_evicted_filter_is_reported_once_and_its_held_text_discarded():
    warnings = []
    filters = Filters(lambda level, message: warnings.append((level, message)), max_streams=4)
    first = filters.segment(("s", "1"))
    assert first.push("<think>\nreasoning") == ""
    filters.release(("s", "1"))
    for n in range(2, 6):  # stateless filters go silently; one with state goes with one WARNING
        filters.segment(("s", str(n)))
        filters.release(("s", str(n)))
    filters.segment(("s", "6")).push("held text without an end")
    filters.segment(("s", "7")).push("<think>\nmore")
    filters.segment(("s", "8")).push("<think>\nmore")
    filters.segment(("s", "9")).push("<think>\nmore")
    assert len(filters) <= 4
    assert [level for level, _ in warnings] == ["WARNING"]
    assert "'1'" in warnings[0][1] and "think" in warnings[0][1] and "discarded" in warnings[0][1]
    assert filters.segment(("s", "1")) is not first  # a fresh one: the held text is gone


# -- form 2: timestamps cannot reach into the future ---------------------------------------------------------------
def test_a_flush_from_the_future_mutes_nothing():
    engine = TextEngine()
    handler, rec = make(engine)
    try:
        handler.on_input("control", pa.array([""]), {"flush": True, "timestamp": dt.datetime(2100, 1, 1,
                                                                                              tzinfo=dt.timezone.utc)})
        handler.on_input("control", pa.array(["reset"]), {"timestamp": dt.datetime(2100, 1, 2, tzinfo=dt.timezone.utc)})
        time.sleep(0.05)
        handler.on_input("text", pa.array(["A text."]), {"tid": "t", "timestamp": now()})
        frag(handler, "A fragment.", segment=7, seq=0, fin=True, timestamp=now())
        rec.wait(lambda r: len(r.of("segment_complete")) == 2)
        assert sorted(a.to_pylist()[0] for a, _ in rec.of("segment_complete")) == ["completed", "completed"]
        clamped = [m for m in logs(rec, "WARNING") if "ahead of the node's clock" in m]
        assert len(clamped) == 2  # one per forged message
    finally:
        handler.stop()


def test_a_fragment_sent_before_a_flush_and_arriving_after_it_is_answered():
    engine = TextEngine()
    handler, rec = make(engine)
    try:
        sent = now()
        handler.on_input("control", pa.array([""]), {"flush": True, "timestamp": now(0.01)})
        frag(handler, "Old answer.", segment=3, seq=0, timestamp=sent)  # its utterance never arrived before
        frag(handler, " More of it.", segment=3, seq=1, fin=True, timestamp=sent)
        frag(handler, "New answer.", segment=4, seq=0, fin=True, timestamp=now(0.02))
        rec.wait(lambda r: len(r.of("segment_complete")) == 2)
        assert handler.wait_idle(5)
        (old,) = answers_of(rec, "s", 3)
        assert old[0] == "error" and old[1]["error"] == FLUSHED and old[1]["error_stage"] == "flush"
        assert [a for a, _ in answers_of(rec, "s", 4)] == ["completed"]
        assert engine.texts == ["New answer."]
    finally:
        handler.stop()


# -- form 3: seq values --------------------------------------------------------------------------------------------
def test_a_negative_seq_loses_no_utterance():
    engine = TextEngine()
    handler, rec = make(engine)
    try:
        frag(handler, "Alone.", segment=1, seq=-1, fin=True)
        frag(handler, "First.", segment=2, seq=-5)
        frag(handler, " Second.", segment=2, seq=0, fin=True)
        rec.wait(lambda r: len(r.of("segment_complete")) == 2)
        assert [a for a, _ in answers_of(rec, "s", 1)] == ["completed"]
        assert [a for a, _ in answers_of(rec, "s", 2)] == ["completed"]
        assert handler.wait_idle(5) and engine.texts == ["Alone.", "First.", "Second."]
        assert sum("is not a fragment number" in m for m in logs(rec, "WARNING")) == 2
    finally:
        handler.stop()


def test_a_dropped_fragment_is_reported():
    engine = TextEngine()
    handler, rec = make(engine)
    try:
        frag(handler, "One.", seq=0)
        frag(handler, "Again.", seq=0)  # a repeat of an open utterance's fragment
        frag(handler, " Two.", seq=1, fin=True)
        rec.wait(lambda r: len(r.of("segment_complete")) == 1)
        frag(handler, "Late.", seq=1)  # a repeat after the segment ended
        assert handler.wait_idle(5)
        time.sleep(0.1)
        dropped = [m for m in logs(rec, "WARNING") if "dropped" in m and "seq" in m]
        assert len(dropped) == 2 and len(rec.of("segment_complete")) == 1
        assert engine.texts == ["One.", "Two."]
    finally:
        handler.stop()


# -- form 4: bounded bytes -----------------------------------------------------------------------------------------
def test_fragments_and_the_intake_are_bounded_with_errors_naming_the_limits():
    engine = TextEngine()
    handler, rec = make(engine, PRIMESPEECH_MAX_FRAGMENT_CHARS="100", PRIMESPEECH_MAX_HELD_CHARS="300",
                        PRIMESPEECH_MAX_INTAKE_CHARS="1000")
    try:
        frag(handler, "x" * 101, segment=1, seq=0, fin=True)  # too long: left out, the utterance's error
        rec.wait(lambda r: len(answers_of(r, "s", 1)) == 1)
        ((outcome, md),) = answers_of(rec, "s", 1)
        assert outcome == "error" and "PRIMESPEECH_MAX_FRAGMENT_CHARS=100" in md["error"]
        for seq in range(1, 5):  # early fragments beyond 300 characters: the gap is skipped
            frag(handler, "y" * 99 + ".", segment=2, seq=seq)
        frag(handler, "Done.", segment=2, seq=5, fin=True)
        rec.wait(lambda r: len(answers_of(r, "s", 2)) == 1)
        assert any("PRIMESPEECH_MAX_HELD_CHARS" in m for m in logs(rec, "WARNING"))
        with handler.intake.hold():  # nothing leaves the intake meanwhile
            for n in range(12):
                handler.on_input("text", pa.array(["z" * 99 + "."]), {"tid": n})
        rec.wait(lambda r: len([m for _, m in r.of("segment_complete") if "tid" in m]) == 12)
        busy = [m for _, m in rec.of("segment_complete") if "tid" in m and m.get("error_stage") == "busy"]
        assert busy and all("PRIMESPEECH_MAX_INTAKE_CHARS" in m["error"] for m in busy)
        assert handler.intake.chars == 0 or handler.wait_idle(5)
    finally:
        handler.stop()


def test_a_1_mb_fragment_and_a_run_of_end_marks_cost_the_intake_little():
    """1.5 KB of one-character "。" fragments and a 1 MB fragment, against a calibration: the same number of
    plain fragments of one letter each through the same handler."""

    def run(fragments) -> float:
        engine = TextEngine()
        handler, rec = make(engine, PRIMESPEECH_SEGMENT_IDLE_S="30")
        try:
            start = time.perf_counter()
            for n, text in enumerate(fragments):
                frag(handler, text, seq=n, fin=n == len(fragments) - 1)
            assert handler.wait_idle(60)
            return time.perf_counter() - start
        finally:
            handler.stop()

    calibration = min(run(["a"] * 1500) for _ in range(2))
    marks = run(["。"] * 1500)
    huge = run(["好" * 1_000_000])
    assert marks < max(5 * calibration, 1.0), (marks, calibration)
    assert huge < max(5 * calibration, 1.0), (huge, calibration)


# -- form 8: cancelled utterances ------------------------------------------------------------------------------------
def test_late_fragments_of_a_cancelled_utterance_stay_dropped_after_many_cancels():
    engine = TextEngine()
    handler, rec = make(engine, PRIMESPEECH_SEGMENT_IDLE_S="30")
    try:
        n = 300  # more than the old fixed memory of 256
        for segment in range(n):
            frag(handler, "Old words", segment=segment, seq=0, flush=segment > 0)
        frag(handler, "New answer.", segment=n, seq=0, fin=True, flush=True)
        rec.wait(lambda r: len(r.of("segment_complete")) == n + 1, timeout=60)
        frag(handler, " still old.", segment=0, seq=1)  # sent after the flushes: late, not cancelled by them
        assert handler.finish(10)  # an utterance it opened would be ended and spoken
        assert not [t for t in engine.texts if "old" in t.lower()]
        assert len(answers_of(rec, "s", 0)) == 1
    finally:
        handler.stop()


# -- property: hostile timestamps and seq values -----------------------------------------------------------------------
TIMESTAMPS = st.sampled_from(["none", "now", "past", "future", "far", "naive", "text"])
SEQS = st.one_of(st.none(), st.integers(-3, 6), st.sampled_from([2**63 - 1, -(2**63), 1.5, 2.0, "3", True]))
EVENTS = st.lists(st.one_of(
    st.tuples(st.just("text"), TIMESTAMPS, st.none()),
    st.tuples(st.sampled_from(["a1", "a2", "b1", "b2"]), TIMESTAMPS, SEQS),
    st.tuples(st.sampled_from(["flush", "reset", "flush-fragment"]), TIMESTAMPS, st.none()),
), max_size=30)


def _timestamp(kind: str):
    return {"none": None, "now": now(), "past": now(-3600), "future": now(600),
            "far": dt.datetime(2100, 1, 1, tzinfo=dt.timezone.utc), "naive": dt.datetime(2100, 1, 1),
            "text": "2100-01-01"}[kind]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=EVENTS)
def test_every_text_and_utterance_is_answered_once_whatever_the_stamps(events):
    engine = FakeEngine()
    handler, rec = make(engine, PRIMESPEECH_SEGMENT_IDLE_S="60")
    texts, segments = [], set()
    last = {}  # the last event of each segment carries its fin
    for n, (kind, _, _) in enumerate(events):
        last[kind] = n
    extra = 0
    for n, (kind, ts, seq) in enumerate(events):
        md = {} if ts == "none" else {"timestamp": _timestamp(ts)}
        if kind == "text":
            texts.append(f"t{n}")
            handler.on_input("text", pa.array(["Some words."]), {**md, "tid": texts[-1]})
        elif kind in ("flush", "reset"):
            handler.on_input("control", pa.array(["" if kind == "flush" else "reset"]),
                             {**md, "flush": kind == "flush"})
        elif kind == "flush-fragment":  # a barge-in that starts a segment of its own
            extra += 1
            segments.add(("c", extra))
            handler.on_input("text", pa.array(["New."]), {**md, "session_id": "c", "segment_id": extra, "seq": 0,
                                                         "fin": True, "flush": True})
        else:
            session, segment = kind[0], int(kind[1])
            segments.add((session, segment))
            meta = {**md, "session_id": session, "segment_id": segment, "fin": last[kind] == n}
            if seq is not None:
                meta["seq"] = seq
            handler.on_input("text", pa.array(["Word. "]), meta)
    assert handler.finish(30)
    answers = rec.of("segment_complete")
    assert sorted(m["tid"] for _, m in answers if "tid" in m) == sorted(texts)
    got = [(m["session_id"], m["segment_id"]) for _, m in answers if "segment_id" in m]
    assert sorted(got) == sorted(segments), (got, segments)
    counts = handler.counts.snapshot()
    assert counts["answered"] == len(answers) and counts["received"] == len(texts)


# -- lost inputs made visible ------------------------------------------------------------------------------------------
def test_each_arrival_is_logged_and_counted_received_and_answered():
    engine = TextEngine()
    handler, rec = make(engine)
    try:
        handler.on_input("text", pa.array(["One."]), {"question_id": "q1", "session_id": "s1"})
        frag(handler, "Two.", session="s2", segment=5, seq=0, fin=True)
        rec.wait(lambda r: len(r.of("segment_complete")) == 2)
        arrivals = [m for m in logs(rec, "DEBUG") if "received" in m]
        assert len(arrivals) == 2
        assert "text 1 received" in arrivals[0] and "question_id=q1" in arrivals[0] and "session_id=s1" in arrivals[0]
        assert "fragment 1 received" in arrivals[1] and "segment '5'" in arrivals[1]
        handler.on_input("control", pa.array(["stats"]), {})
        rec.wait(lambda r: any(s["status"] == "stats" for s in r.statuses()))
        (stats,) = [s for s in rec.statuses() if s["status"] == "stats"]
        counts = stats["node_counts"]
        assert (counts["received"], counts["fragments"], counts["answered"]) == (1, 1, 2)
    finally:
        handler.stop()


# -- form 5: a run of end marks is cut like any other run ----------------------------------------------------------
def test_a_run_of_end_marks_is_cut_at_the_sentence_limit():
    from dora_primespeech_mlx.dataflow.sentences import MAX_SENTENCE_CHARS, SentenceCutter

    for step in (1, 7, 3000):
        cutter, out = SentenceCutter(), []
        text = "好" + "。" * 1500
        for i in range(0, len(text), step):
            out += cutter.push(text[i:i + step])
        out += cutter.finish()
        assert "".join(out) == text and max(len(s) for s in out) <= MAX_SENTENCE_CHARS, [len(s) for s in out]
        assert len(out[0]) == MAX_SENTENCE_CHARS  # cut as soon as the run reaches the limit, not at its end


def test_a_sessions_cancel_is_kept_however_many_other_sessions_are_cancelled(monkeypatch):
    """A session's cancel is remembered for a time, not a count: cancelling 300 other sessions does not let a text
    sent before the first cancel through; past the window it is forgotten."""
    from dora_primespeech_mlx.dataflow import cancellation
    from dora_primespeech_mlx.dataflow.order import Stamp

    base = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    at = lambda s, n: Stamp(base + dt.timedelta(seconds=s), None, n)  # noqa: E731
    marks = cancellation.Marks()
    marks.note_session("first", at(10, 0))
    for i in range(300):
        marks.note_session(f"other-{i}", at(11 + i, i + 1))
    assert marks.cancelled(at(5, 400), "first") == (cancellation.SESSION_CANCELLED, "cancel")
    assert marks.cancelled(at(20, 401), "first") is None  # sent after its cancel
    assert marks.cancelled(at(5, 402), "unknown") is None
    later = time.monotonic() + cancellation.SESSION_MARK_S + 1
    monkeypatch.setattr(cancellation.time, "monotonic", lambda: later)
    assert marks.cancelled(at(5, 403), "first") is None  # the window is over


def test_an_utterance_fed_one_character_at_a_time_places_its_sentences_linearly():
    """The utterance's text (what its chunks' spans index) grows by parts, joined when read: feeding 40 000
    one-character fragments: 160 000 cost about 8x what 20 000 cost (appending to one string, over 20x), and the
    tiles cover the sentences."""
    from dora_primespeech_mlx.dataflow.sentences import LlmFeed
    from dora_primespeech_mlx.dataflow.utterance import Fragment, Utterance

    def feed(n: int) -> tuple[float, Utterance]:
        u = Utterance(("s", "1"), {}, None, LlmFeed(None))
        text = ("这是一句话。" * (n // 6 + 1))[:n]
        t0 = time.perf_counter()
        for i, ch in enumerate(text):
            u.sentences_of(Fragment(ch, i, i == n - 1))
        return time.perf_counter() - t0, u

    small = min(feed(20_000)[0] for _ in range(2))
    big, u = min((feed(160_000) for _ in range(2)), key=lambda r: r[0])
    text = u.heard.joined()
    assert len(text) >= 160_000 and len(u.tiles) >= 160_000 // 6 - 1
    assert all(text[a:b].strip() and text[t:a].strip() == "" for t, a, b in u.tiles)
    assert big < 14 * max(small, 1e-3), (small, big)
