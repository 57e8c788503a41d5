"""Exactly one answer per text whatever its metadata: every output the handler sends passes dora's metadata type
rules (dora-contract.md 13.4, plus int64 integers), hostile values are dropped or sent as strings with one
WARNING per text, and a send dora refuses for its metadata goes out again with string metadata."""

from __future__ import annotations

import datetime as dt
import json
import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_reliability import FakeEngine, Recorder, make

from dora_primespeech_mlx.dataflow.metadata import (
    INT64_MAX,
    METADATA_MAX_CHARS,
    METADATA_MAX_DEPTH,
    METADATA_MAX_ITEMS,
    METADATA_MAX_KEYS,
    normalize_segment_index,
    sanitize_metadata,
)
from dora_primespeech_mlx.dataflow.transport import DirectTransport, OutboxTransport, send_safely


def dora_value_error(value) -> Exception | None:
    """What dora's ``send_output`` does with one metadata value: None when it sends it as it is, else the
    exception it raises (or would coerce with a warning: refused here too, the node must not rely on it)."""
    if isinstance(value, (bool, str, dt.datetime)):
        return None
    if isinstance(value, int):
        return None if -(2**63) <= value <= INT64_MAX else OverflowError("int too big to convert")
    if isinstance(value, float):
        return None
    if isinstance(value, list):
        kinds = {type(v) for v in value}
        if kinds in (set(), {str}, {float}):
            return None
        if kinds == {int}:
            return next((e for e in map(dora_value_error, value) if e is not None), None)
        return TypeError(f"list of {sorted(k.__name__ for k in kinds)}")
    return TypeError(f"metadata value type not supported: {type(value).__name__}")


class DoraRules(Recorder):
    """A recorder that refuses (raises, as dora does) metadata dora cannot send, and remembers each refusal."""

    def __init__(self):
        super().__init__()
        self.refused: list[str] = []

    def __call__(self, output, array, metadata):
        for key, value in metadata.items():
            error = RuntimeError("Parsing metadata keys") if not isinstance(key, str) else dora_value_error(value)
            if error is not None:
                self.refused.append(f"{output} {key!r}: {error}")
                raise error
        super().__call__(output, array, metadata)


_long = st.builds(lambda s, n: s * n, st.text(min_size=1, max_size=3), st.integers(0, 3000))
_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-(2**80), 2**80), st.floats(), _long, st.binary(max_size=9),
    st.builds(lambda: 10**5000),  # (no repr: more than 4300 digits)
    st.sampled_from([2**63, -(2**63) - 1, 1e19, 1e308, math.inf, -math.inf, math.nan, "1e308",
                     "9223372036854775808", np.int64(7), np.float32(0.5), np.uint64(2**64 - 1), b"\xff\xfe",
                     dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)]),
)


def _nest(depth: int, leaf):
    for _ in range(depth):
        leaf = [leaf] if depth % 2 else {"k": leaf}
    return leaf


_deep = st.builds(_nest, st.integers(1, 3000), st.integers())
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.lists(inner, max_size=4).map(tuple), st.dictionaries(st.text(max_size=8), inner,
                                                                                         max_size=3)), max_leaves=10)
_values = st.one_of(_values, _deep, st.integers(0, 3000).map(lambda n: list(range(n))),
                    st.integers(0, 2000).map(lambda n: {"a": "x" * n}))
_keys = st.one_of(st.text(max_size=12), st.sampled_from(["segment_index", "question_id", "session_id"]),
                  st.integers(), _long)
_metadata = st.one_of(st.none(), st.dictionaries(_keys, _values, max_size=6),
                      st.integers(0, 200).map(lambda n: {f"k{i}": i for i in range(n)}))

_SHARED: dict = {}


def _shared():
    if not _SHARED:
        rec = DoraRules()
        handler, _ = make(FakeEngine(), rec, STREAMING="false")
        _SHARED.update(handler=handler, rec=rec)
    return _SHARED["handler"], _SHARED["rec"]


@settings(max_examples=200, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(metadatas=st.lists(_metadata, min_size=1, max_size=4))
def test_one_answer_per_text_whatever_its_metadata(metadatas):
    handler, rec = _shared()
    with rec.cv:
        rec.sent.clear()
    for md in metadatas:
        handler.on_input("text", pa.array(["Hello."]), md)
        handler.on_input("control", pa.array(["stats"]), md)
    assert handler.wait_idle(20)
    assert rec.refused == []  # nothing the node sent needed dora's refusal (or the fallback)
    assert len(rec.of("segment_complete")) == len(metadatas)
    assert [a.to_pylist()[0] for a, _ in rec.of("segment_complete")] == ["completed"] * len(metadatas)
    for _, md in rec.sent and [(a, m) for _, a, m in rec.sent]:
        assert len(md) <= METADATA_MAX_KEYS + 12  # (the node's own fields come on top)


@pytest.mark.parametrize("index", ["1e308", "9223372036854775808", 1e19, 2**63, -(2**63) - 1, math.inf, "nan"])
def test_an_oversized_segment_index_is_answered_and_warned(index):
    rec = DoraRules()
    handler, _ = make(FakeEngine(), rec, STREAMING="false")
    handler.on_input("text", pa.array(["Hello."]), {"segment_index": index, "question_id": "q1"})
    assert handler.finish(10)
    ((outcome, md),) = [(a.to_pylist()[0], m) for a, m in rec.of("segment_complete")]
    assert outcome == "completed" and md["question_id"] == "q1"
    assert not isinstance(md["segment_index"], int) or -(2**63) <= md["segment_index"] <= INT64_MAX
    assert rec.refused == []


def test_bounds_drop_values_and_say_so():
    problems: list[str] = []
    out = sanitize_metadata({
        "deep": json.loads("[" * (METADATA_MAX_DEPTH + 1) + "]" * (METADATA_MAX_DEPTH + 1)),
        "ok_deep": json.loads("[" * METADATA_MAX_DEPTH + "]" * METADATA_MAX_DEPTH),
        "long": "x" * (METADATA_MAX_CHARS + 1), "ok_long": "x" * METADATA_MAX_CHARS,
        "many": list(range(METADATA_MAX_ITEMS + 1)), "big": 2**63, "nan": math.nan, "huge": 10**5000,
        "bigs": [1, 2**64], "q": "kept", **{f"k{i}": i for i in range(METADATA_MAX_KEYS)},
    }, problems)
    assert "deep" not in out and "long" not in out and "many" not in out and "huge" not in out
    assert out["ok_long"] == "x" * METADATA_MAX_CHARS and isinstance(out["ok_deep"], str)
    assert out["big"] == str(2**63) and out["nan"] == "nan" and json.loads(out["bigs"]) == [1, 2**64]
    assert out["q"] == "kept" and len(out) == METADATA_MAX_KEYS - 4  # (the four dropped count among the first)
    text = "; ".join(problems)
    for word in ("'deep'", "'long'", "'many'", "'big'", "'nan'", "'huge'", "'bigs'", "beyond the first"):
        assert word in text


@pytest.mark.parametrize("raw", [1e19, "1e308", "9223372036854775808", 2.0**63])
def test_segment_index_beyond_int64_stays_as_it_came(raw):
    md = {"segment_index": raw}
    assert normalize_segment_index(md) is False and md["segment_index"] == raw
    md = {"segment_index": str(INT64_MAX)}
    assert normalize_segment_index(md) and md["segment_index"] == INT64_MAX


def test_one_warning_per_text_with_bad_metadata():
    handler, rec = make(FakeEngine())
    handler.on_input("text", pa.array(["Hello."]), {"a": 2**70, "b": math.inf, "c": "x" * 10**5})
    handler.on_input("text", pa.array(["Hello."]), {"fine": 1})
    assert handler.finish(10)
    warnings = [json.loads(a[0].as_py())["message"] for a, m in rec.of("log") if m["level"] == "WARNING"]
    assert len(warnings) == 1 and all(k in warnings[0] for k in ("'a'", "'b'", "'c'"))
    assert len(warnings[0]) < 1200


def test_a_send_refused_for_its_metadata_goes_out_with_string_metadata():
    rec = DoraRules()
    send_safely(rec, "segment_complete", pa.array(["completed"]), {"i": 2**64, "ok": 1, 3: [1, "a"]})
    ((_, md),) = rec.of("segment_complete")
    assert md == {"i": str(2**64), "ok": "1", "3": "[1, 'a']"} and len(rec.refused) == 1
    direct = DirectTransport(rec)
    direct.send("audio", pa.array([0.0]), {"x": None})
    assert rec.of("audio")[0][1] == {"x": "None"}
    outbox = OutboxTransport()
    outbox.send("status", pa.array(["s"]), {"x": 2**64})
    outbox.send("log", pa.array(["l"]), {"y": 1})

    def broken(output, array, metadata):
        if output == "status":
            raise ConnectionError("gone")
        rec(output, array, metadata)

    outbox.flush(broken)  # one lost output does not take the main thread (or the next outputs) down
    assert rec.of("log")[0][1] == {"y": 1}


def test_a_send_failing_for_another_reason_is_not_resent_with_string_metadata():
    calls = []

    def flaky(output, array, metadata):
        calls.append(metadata)
        raise RuntimeError("connection lost")

    with pytest.raises(RuntimeError):
        send_safely(flaky, "segment_complete", pa.array(["completed"]), {"t": 3, "ids": [1, 2]})
    assert calls == [{"t": 3, "ids": [1, 2]}]  # (the handler's own retry sends it again, as it is)
