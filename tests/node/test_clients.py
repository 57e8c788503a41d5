"""The message shapes real clients rely on (MoFA players and viewer, the MoFA Studio conference segmenter,
dora-hub's dora-pyaudio), checked on what the handler sends (fake engine: no models)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from test_reliability import FakeEngine, make


def _send(handler, text, **md):
    handler.on_input("text", pa.array([text]), md)


@pytest.mark.parametrize("streaming", ["false", "true"])
def test_segment_index_is_an_int_players_can_add_to(streaming):
    handler, rec = make(FakeEngine(), STREAMING=streaming)
    _send(handler, "Hello there.", question_id="q7", session_status="ongoing", segment_index="3")
    _send(handler, "Again.", question_id="q7", session_status="ongoing", segment_index=4.0)
    _send(handler, "And again.", question_id="q7", session_status="ended", segment_index=5)
    assert handler.finish(10)
    for _array, md in rec.of("audio") + rec.of("segment_complete"):
        assert type(md["segment_index"]) is int and md["segment_index"] + 1 > 0  # audio_player.py: index + 1
        assert md["question_id"] == "q7" and isinstance(md["session_status"], str)
    for _array, md in rec.of("audio"):
        assert type(md["sample_rate"]) is int and type(md["duration"]) is float
        assert isinstance(md["is_final"], bool) and type(md["fragment_num"]) is int
    assert [m["segment_index"] for _, m in rec.of("segment_complete")] == [3, 4, 5]


def test_a_non_numeric_segment_index_passes_unchanged_and_is_logged_once():
    handler, rec = make(FakeEngine())
    _send(handler, "One.", segment_index="intro")
    _send(handler, "Two.", segment_index="outro")
    _send(handler, "Three.", segment_index="2.5")
    assert handler.finish(10)
    assert [m["segment_index"] for _, m in rec.of("segment_complete")] == ["intro", "outro", "2.5"]
    logs = [json.loads(a[0].as_py()) for a, _ in rec.of("log")]
    warnings = [m["message"] for m in logs if m["level"] == "WARNING" and "segment_index" in m["message"]]
    assert len(warnings) == 1  # (each arrival's DEBUG line names it too)


@pytest.mark.parametrize("text", ["😊！", "。。。", ""])
def test_a_skipped_text_gets_one_silent_audio_and_its_answer(text):
    """The conference segmenter releases the next segment on the player's audio_complete (one per audio):
    a text without speech must still produce one audio message."""
    handler, rec = make(FakeEngine())
    _send(handler, text, question_id="q1", session_status="ongoing", segment_index=0, participant="judge")
    assert handler.finish(10)
    ((audio, md),) = rec.of("audio")
    assert md["silent"] is True and md["is_final"] is True and md["participant"] == "judge"
    assert audio.type == pa.list_(pa.float32()) and 0 < len(audio[0]) <= 3200 and not any(audio[0].as_py())
    ((done, _),) = rec.of("segment_complete")
    assert done.to_pylist() == ["skipped"]


def test_a_failed_text_gets_silence_too():
    engine = FakeEngine(fail_rate=1.0)
    engine.rng.choice = lambda options: RuntimeError("boom")
    handler, rec = make(engine)
    _send(handler, "This fails.", question_id="q1")
    assert handler.finish(10)
    assert len(rec.of("audio")) == 1 and rec.of("segment_complete")[0][0].to_pylist() == ["error"]
    assert rec.of("segment_complete")[0][1]["session_status"] == "error"


def test_silence_can_be_switched_off():
    handler, rec = make(FakeEngine(), SILENCE_ON_SKIP="false")
    _send(handler, "。。。")
    assert handler.finish(10)
    assert rec.of("audio") == [] and len(rec.of("segment_complete")) == 1


@pytest.mark.parametrize(("fmt", "kind"), [("list", "ListArray"), ("flat", "FloatArray")])
def test_audio_formats(fmt, kind):
    """list: the MoFA players (pa.array([samples]), they call len() on the first item); flat: dora-pyaudio
    (it plays event["value"].to_numpy())."""
    handler, rec = make(FakeEngine(), AUDIO_FORMAT=fmt)
    _send(handler, "Hello.")
    assert handler.finish(10)
    ((audio, _),) = rec.of("audio")
    assert type(audio).__name__ == kind
    samples = audio.to_numpy() if fmt == "flat" else audio[0].values.to_numpy()
    assert samples.dtype.name == "float32" and len(samples) > 0
