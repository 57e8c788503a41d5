"""The handler's promises with a fake engine and a fake transport (no models, no dora): exactly one
``segment_complete`` per text in input order whatever fails, prompt control, exact reset counts, a bounded
queue, a supervised worker, STOP."""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
from conftest import full_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dora_primespeech_mlx.dataflow.handler import CANCELLED, STOPPING, MessageHandler
from dora_primespeech_mlx.dataflow.messages import ECHO_CHARS
from dora_primespeech_mlx.dataflow.transport import DirectTransport
from dora_primespeech_mlx.errors import NothingToSpeakError, SynthesisCancelled, SynthesisError
from dora_primespeech_mlx.settings import Settings

VOICE = SimpleNamespace(name="Fake", language="en")


@dataclass
class Result:
    audio: np.ndarray
    sample_rate: int = 32000
    timings: dict | None = None


class FakeEngine:
    """Speaks instantly (or blocks until ``gate`` opens); raises where ``rng`` says so."""

    def __init__(self, rng: random.Random | None = None, fail_rate: float = 0.0, gate: threading.Event | None = None):
        self.rng = rng or random.Random(0)
        self.fail_rate = fail_rate
        self.gate = gate
        self.started = threading.Event()
        self.calls = 0

    def _maybe_fail(self):
        if self.rng.random() < self.fail_rate:
            raise self.rng.choice([RuntimeError("boom"), SynthesisError("sovits died", stage="sovits"),
                                   ValueError("bad"), NothingToSpeakError("nothing"), KeyError("k"),
                                   RecursionError("deep"), MemoryError("oom")])

    def _wait(self, cancel):
        self.started.set()
        if self.gate is not None:
            while not self.gate.wait(0.01):
                if cancel is not None and cancel.is_set():
                    raise SynthesisCancelled("cancelled")

    def synthesize(self, text, voice=None, cancel=None, **kw):
        self.calls += 1
        self._wait(cancel)
        self._maybe_fail()
        return Result(np.zeros(320, np.float32))

    def synthesize_stream(self, text, voice=None, cancel=None, **kw):
        self.calls += 1
        self._maybe_fail()

        def gen():
            for i in range(3):
                self._wait(cancel)
                self._maybe_fail()
                yield SimpleNamespace(audio=np.zeros(160, np.float32), sample_rate=32000, chunk_index=i,
                                      is_final=i == 2)

        return gen()

    def stats(self):
        return {"requests": self.calls}

    def list_voices(self):
        return [{"name": "Fake"}]

    def cleanup(self):
        return {"models": 0}

    def load_voice(self, spec):
        self._maybe_fail()
        return spec


class Recorder:
    """A transport's send: records what got through; fails where ``rng`` says so (a segment_complete only on
    its first try, so the handler's retry gets it through). Sends come from several threads (the worker's
    answers, the input thread's logs and statuses): "its first try" is kept per thread, so a log sent from
    another thread between a failed segment_complete and its retry cannot make the retry fail too."""

    def __init__(self, rng: random.Random | None = None, fail_rate: float = 0.0):
        self.rng = rng or random.Random(0)
        self.fail_rate = fail_rate
        self.sent: list[tuple[str, pa.Array, dict]] = []
        self.cv = threading.Condition()
        self._failed_answer: set[int] = set()  # threads whose last segment_complete failed

    def __call__(self, output, array, metadata):
        assert isinstance(array, pa.Array) and all(isinstance(k, str) for k in metadata)
        me = threading.get_ident()
        with self.cv:
            retry = output == "segment_complete" and me in self._failed_answer
            if output == "segment_complete":
                self._failed_answer.discard(me)
            if self.fail_rate and not retry and self.rng.random() < self.fail_rate:
                if output == "segment_complete":
                    self._failed_answer.add(me)
                raise RuntimeError(f"send {output} failed")
        with self.cv:
            self.sent.append((output, array, dict(metadata)))
            self.cv.notify_all()

    def of(self, output):
        with self.cv:
            return [(a, m) for o, a, m in self.sent if o == output]

    def statuses(self):
        return [json.loads(a[0].as_py()) for a, _ in self.of("status")]

    def wait(self, pred, timeout=10.0):
        with self.cv:
            assert self.cv.wait_for(lambda: pred(self), timeout), "timed out"


def make(engine, recorder=None, **env):
    settings = Settings.from_env({"LOG_LEVEL": "DEBUG", "GPTSVITS_WARMUP": "false", **env})
    rec = recorder or Recorder()
    handler = MessageHandler(settings, lambda progress: (engine, VOICE), DirectTransport(rec))
    handler.start()
    assert handler.ready.wait(10)
    return handler, rec


# ---------------------------------------------------------------------------------------------------
# property: exactly one segment_complete per text, in order, whatever the input and whatever fails

_unicode = st.text(max_size=40)
_payloads = st.one_of(
    _unicode,
    st.binary(max_size=30),
    st.integers(1, 4000).map(lambda n: "[" * n + "]" * n),
    st.integers(1, 4000).map(lambda n: '{"a":' * n + "1" + "}" * n),
    st.dictionaries(st.sampled_from(["prompt", "text", "speed", "voice", "language", "top_k", "seed", "volume",
                                     "pitch"]), st.one_of(_unicode, st.integers(), st.floats(), st.none(),
                                                          st.lists(st.integers(), max_size=3)),
                    max_size=5).map(json.dumps),
    st.builds(lambda parts: "VOICE:" + "|".join(parts), st.lists(_unicode, max_size=7)),
    st.sampled_from(["Hello world.", "。。。", "", "VOICE:CUSTOM|/nope.wav|hi|en|Hello", "VOICE:Nobody|hi"]),
)
_meta_values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), _unicode,
                                      st.binary(max_size=5)),
                            lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                    st.dictionaries(_unicode, inner, max_size=3)), max_leaves=8)
_metadata = st.one_of(st.none(), st.integers(), st.dictionaries(_unicode, _meta_values, max_size=4))
_events = st.lists(st.tuples(st.sampled_from(["text", "text", "text", "control", "reset"]), _payloads, _metadata,
                             st.booleans()), min_size=1, max_size=12)
_controls = ["stats", "list_voices", "cleanup", "change_voice:Fake", "reset", "make coffee"]

_SHARED: dict = {}


def _shared_handler():
    """One handler for every generated sequence (each waits for the last one's answers): 10 000 handlers
    would leave 10 000 parked worker threads behind."""
    if not _SHARED:
        rng = random.Random(1234)
        engine = FakeEngine(rng, fail_rate=0.2)
        rec = Recorder(rng, fail_rate=0.1)
        handler, _ = make(engine, rec, STREAMING="false")
        _SHARED.update(handler=handler, rec=rec, engine=engine)
    return _SHARED["handler"], _SHARED["rec"], _SHARED["engine"]


# 10 000 generated sequences under --full; the quick tier runs the first 300 of the same derandomized draw
EXAMPLES = 10_000 if full_run() else 300


@pytest.mark.tiered
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(events=_events, streaming=st.booleans())
def test_every_text_gets_exactly_one_answer_in_order(events, streaming):
    handler, rec, _ = _shared_handler()
    handler.settings = Settings.from_env({"LOG_LEVEL": "DEBUG", "STREAMING": str(streaming).lower()})
    with rec.cv:
        rec.sent.clear()
    tids = []
    for i, (kind, payload, metadata, as_bytes) in enumerate(events):
        if kind == "text":
            md = dict(metadata, tid=i) if isinstance(metadata, dict) else metadata
            tids.append(i if isinstance(metadata, dict) else None)
            value = payload.encode("utf-8", "surrogatepass") if as_bytes and isinstance(payload, str) else payload
            arr = pa.array([value], type=pa.binary() if isinstance(value, bytes) else pa.string())
            handler.on_input("text", arr, md)
        elif kind == "control":
            handler.on_input("control", pa.array([_controls[i % len(_controls)]]), metadata)
        else:
            handler.on_input("reset", pa.array([True]), metadata)
    assert handler.wait_idle(20)
    done = rec.of("segment_complete")
    assert len(done) == len(tids)
    seen = [m.get("tid") for _, m in done]
    assert [t for t in seen if t is not None] == [t for t in tids if t is not None]
    for array, _ in done:
        assert array.to_pylist()[0] in ("completed", "skipped", "error")


def test_the_shared_handler_saw_failures_of_every_kind():
    """The property above really exercised the failure paths (it ran first: tests run in file order)."""
    handler, rec, engine = _shared_handler()
    counts = handler.counts
    assert counts["errors"] > EXAMPLES // 100 and counts["completed"] > EXAMPLES // 100  # (> 100 of 10 000)
    assert counts["skipped"] > EXAMPLES // 1000
    assert counts["texts"] == counts["errors"] + counts["completed"] + counts["skipped"]


# ---------------------------------------------------------------------------------------------------
# control is prompt, order is kept, counts are exact


def test_control_is_answered_at_once_with_a_full_queue():
    gate = threading.Event()
    engine = FakeEngine(gate=gate)
    handler, rec = make(engine)
    for i in range(1000):
        handler.on_input("text", pa.array([f"text {i}"]), {"i": i})
    assert engine.started.wait(5)
    for cmd in ("stats", "list_voices"):
        t0 = time.perf_counter()
        handler.on_input("control", pa.array([cmd]), {"cmd": cmd})
        rec.wait(lambda r, c=cmd: any(m.get("cmd") == c for _, m in r.of("status")), timeout=1)
        assert time.perf_counter() - t0 < 0.1, cmd
    stats = next(s for s in rec.statuses() if s["status"] == "stats")
    assert stats["queued"] == 1000
    # cleanup: the input thread only queues it; the worker runs it next, between two texts (never inside a
    # text's audio), ahead of the queued texts.
    t0 = time.perf_counter()
    handler.on_input("control", pa.array(["cleanup"]), {"cmd": "cleanup"})
    assert time.perf_counter() - t0 < 0.1
    gate.set()
    rec.wait(lambda r: any(m.get("cmd") == "cleanup" for _, m in r.of("status")), timeout=10)
    # count what was sent before the cleanup's answer: the worker goes on with the queue meanwhile
    with rec.cv:
        sent = list(rec.sent)
    at = next(i for i, (o, _, m) in enumerate(sent) if o == "status" and m.get("cmd") == "cleanup")
    before = [m["i"] for o, _, m in sent[:at] if o == "segment_complete"]
    assert before in ([0], [0, 1]), before  # the text in flight (and perhaps the next) before it
    handler.on_input("reset", pa.array(["x"]), {})
    assert handler.finish(30)
    assert len(rec.of("segment_complete")) == 1000


def test_reset_counts_each_text_once_and_answers_in_order():
    gate = threading.Event()
    engine = FakeEngine(gate=gate)
    handler, rec = make(engine)
    for i in range(5):
        handler.on_input("text", pa.array([f"text {i}"]), {"i": i})
    assert engine.started.wait(5)
    handler.on_input("control", pa.array(["reset"]), {"r": 1})
    handler.on_input("control", pa.array(["reset"]), {"r": 2})
    resets = [s for s in rec.statuses() if s["status"] == "reset"]
    assert [s["cancelled"] for s in resets] == [5, 0]
    done = rec.of("segment_complete")
    assert [m["i"] for _, m in done] == [0, 1, 2, 3, 4]
    assert all(m["error"] == CANCELLED for _, m in done)
    assert handler.counts["cancelled"] == 5
    gate.set()
    handler.on_input("text", pa.array(["after"]), {"i": 5})
    assert handler.finish(30)
    done = rec.of("segment_complete")
    assert [m["i"] for _, m in done] == [0, 1, 2, 3, 4, 5] and done[-1][0].to_pylist() == ["completed"]
    assert not [1 for _, m in rec.of("audio") if m["i"] < 5], "no audio after a text was answered"


def test_change_voice_keeps_its_place_among_texts():
    engine = FakeEngine()
    order = []
    engine.load_voice = lambda spec: order.append(("voice", spec.name))
    real = engine.synthesize
    engine.synthesize = lambda text, voice=None, **kw: order.append(("text", voice.name)) or real(text, voice, **kw)
    handler, rec = make(engine)
    import dora_primespeech_mlx.dataflow.voices as voices_mod  # where the handler resolves names

    other = SimpleNamespace(name="Other", language="en")
    orig = voices_mod.resolve_voice
    voices_mod.resolve_voice = lambda name, root=None, **kw: other
    try:
        handler.on_input("text", pa.array(["one"]), {})
        handler.on_input("control", pa.array(["change_voice:Other"]), {})
        handler.on_input("text", pa.array(["two"]), {})
        assert handler.finish(10)
    finally:
        voices_mod.resolve_voice = orig
    assert order == [("text", "Fake"), ("voice", "Other"), ("text", "Other")]


def test_a_full_queue_answers_busy_at_once():
    gate = threading.Event()
    engine = FakeEngine(gate=gate)
    handler, rec = make(engine, MAX_QUEUED_TEXTS="3")
    for i in range(6):
        handler.on_input("text", pa.array([f"t{i}"]), {"i": i})
        if i == 0:
            assert engine.started.wait(5)
    busy = [m["i"] for _, m in rec.of("segment_complete") if m.get("error_stage") == "busy"]
    assert busy == [4, 5] and handler.counts["busy"] == 2
    gate.set()
    assert handler.finish(10)
    assert sorted(m["i"] for _, m in rec.of("segment_complete")) == list(range(6))


# ---------------------------------------------------------------------------------------------------
# the worker is supervised; STOP answers everything


class Die(BaseException):
    """Escapes every ``except Exception``: the worker thread ends."""


def test_a_dead_worker_is_replaced_and_its_text_answered():
    engine = FakeEngine()
    calls = []

    def synthesize(text, voice=None, cancel=None, **kw):
        calls.append(text)
        if text == "die":
            raise Die
        return Result(np.zeros(10, np.float32))

    engine.synthesize = synthesize
    handler, rec = make(engine)
    handler.on_input("text", pa.array(["die"]), {"i": 0})
    handler.on_input("text", pa.array(["after"]), {"i": 1})
    rec.wait(lambda r: len(r.of("segment_complete")) == 2, timeout=5)
    (a, ma), (b, mb) = rec.of("segment_complete")
    assert a.to_pylist() == ["error"] and ma["i"] == 0 and ma["error_stage"] == "node"
    assert b.to_pylist() == ["completed"] and mb["i"] == 1
    assert handler.counts["worker_restarts"] == 1


def test_stop_answers_the_text_in_flight_and_the_queue_at_once():
    gate = threading.Event()
    engine = FakeEngine(gate=gate)
    handler, rec = make(engine)
    for i in range(4):
        handler.on_input("text", pa.array([f"t{i}"]), {"i": i})
        handler.on_input("control", pa.array(["change_voice:X"]), {})
    assert engine.started.wait(5)
    t0 = time.perf_counter()
    assert handler.stop() == 4
    assert time.perf_counter() - t0 < 0.5
    done = rec.of("segment_complete")
    assert [m["i"] for _, m in done] == [0, 1, 2, 3] and all(m["error"] == STOPPING for _, m in done)
    handler.on_input("text", pa.array(["late"]), {"i": 9})
    assert rec.of("segment_complete")[-1][1]["i"] == 9
    assert handler.parked.wait(5), "the worker ends once the engine returns"
    assert not [s for s in rec.statuses() if s["status"] in ("voice_changed", "error") and "command" in s]


@pytest.mark.parametrize("payload", ["[" * 5000 + "]" * 5000, '{"prompt":' * 3000 + '"x"' + "}" * 3000])
def test_deeply_nested_json_is_answered(payload):
    handler, rec = make(FakeEngine())
    handler.on_input("text", pa.array([payload]), {"i": 1})
    assert handler.finish(10)
    (done,) = rec.of("segment_complete")
    assert done[1]["i"] == 1


class NaNEngine(FakeEngine):
    """Audio with a NaN in its second chunk (streaming) or in its one result."""

    def synthesize(self, text, voice=None, cancel=None, **kw):
        audio = np.zeros(320, np.float32)
        audio[7] = np.nan
        return Result(audio)

    def synthesize_stream(self, text, voice=None, cancel=None, **kw):
        for i in range(3):
            audio = np.zeros(160, np.float32)
            audio[3] = np.inf if i == 1 else 0.0
            yield SimpleNamespace(audio=audio, sample_rate=32000, chunk_index=i, is_final=i == 2)


@pytest.mark.parametrize("streaming", [False, True])
def test_non_finite_audio_never_leaves_the_node(streaming):
    handler, rec = make(NaNEngine(), STREAMING=str(streaming).lower(), SILENCE_ON_SKIP="false")
    handler.on_input("text", pa.array(["Hello."]), {"i": 1})
    assert handler.finish(10)
    ((outcome, md),) = [(a.to_pylist()[0], m) for a, m in rec.of("segment_complete")]
    assert outcome == "error" and "Fake" in md["error"] and "non-finite" in md["error"]
    audio = rec.of("audio")
    assert len(audio) == (1 if streaming else 0)  # (the stream's first chunk was fine)
    for array, _ in audio:
        assert np.isfinite(np.asarray(array.flatten() if hasattr(array, "flatten") else array)).all()


@pytest.mark.parametrize("kind, value", [("text", "VOICE:" + "n" * 5_000_000 + "|Hello"),
                                         ("control", "change_voice:" + "x" * 10_000),
                                         ("text", "VOICE:Nobody" + "y" * 200 + "|Hello")])
def test_errors_quote_a_bounded_part_of_the_input(kind, value):
    """A 5 MB voice name gave 20 MB of outputs, a long change_voice name was quoted twice per message."""
    handler, rec = make(FakeEngine())
    handler.on_input(kind, pa.array([value]), {})
    assert handler.finish(10)
    sent = [(o, a.to_pylist(), m) for o, a, m in rec.sent if o in ("log", "status", "segment_complete")]
    size = sum(len(json.dumps([a, m], default=str)) for _, a, m in sent)
    assert size < 20_000, size
    for _, array, md in sent:
        fields = [v for a in array for v in (json.loads(a).values() if a.startswith("{") else [a])]
        for text in map(str, [*fields, *md.values()]):
            for letter in "xn":  # one quote of at most ECHO_CHARS of the input per message
                assert text.count(letter * 10) <= ECHO_CHARS // 10
