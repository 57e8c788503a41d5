"""Send order across inputs, one answer per text, cleanup off the input thread (a fake engine), and control
latency / reset while the worker runs the REAL text front end on the slowest texts found (the fixture voice)."""

from __future__ import annotations

import datetime as dt
import json
import random
import string
import threading
import time
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
from conftest import load_text_data
from test_handler import Recorder, make_handler
from tiny_voice import make_model_dir

from dora_primespeech_mlx.dataflow.handler import CANCELLED, MessageHandler
from dora_primespeech_mlx.dataflow.transport import DirectTransport
from dora_primespeech_mlx.errors import SynthesisError
from dora_primespeech_mlx.settings import Settings

DATA = load_text_data()  # the text front end's folders (tests/conftest.py)

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def at(ms: float, **md) -> dict:
    """Metadata as dora 1.x delivers it: the send ``timestamp`` (here ``ms`` after T0) and the sender's keys."""
    return {"timestamp": T0 + dt.timedelta(milliseconds=ms), **md}


class FakeEngine:
    """Records (text, voice) per request; each request takes ``hold`` seconds unless cancelled."""

    def __init__(self, hold: float = 0.0, fail: set[str] | None = None):
        self.hold, self.fail = hold, fail or set()
        self.spoken: list[tuple[str, str]] = []
        self.started = threading.Event()
        self.cleanups = 0

    def synthesize(self, text, voice=None, cancel=None, **kw):
        self.started.set()
        self.spoken.append((text, voice.name))
        deadline = time.monotonic() + self.hold
        while time.monotonic() < deadline and not (cancel is not None and cancel.is_set()):
            time.sleep(0.005)
        if text in self.fail:
            raise SynthesisError(f"failed on {text}")
        return SimpleNamespace(audio=np.zeros(320, np.float32), sample_rate=32000, timings={})

    def stats(self):
        return {"requests": len(self.spoken)}

    def list_voices(self):
        return [{"name": "A"}, {"name": "B"}]

    def cleanup(self):
        time.sleep(1.0)  # what a real cleanup may take (gc, freeing caches)
        self.cleanups += 1
        return {"models": 0}

    def load_voice(self, spec):
        return spec


def fake_handler(engine: FakeEngine, monkeypatch, send=None):
    from dora_primespeech_mlx.dataflow import voices

    monkeypatch.setattr(voices, "resolve_voice", lambda name, root, **kw: SimpleNamespace(name=name, language="en"))
    rec = Recorder()
    transport = DirectTransport(send or rec)
    handler = MessageHandler(Settings.from_env({"LOG_LEVEL": "DEBUG"}),
                             lambda progress: (engine, SimpleNamespace(name="A", language="en")), transport)
    handler.start()
    assert handler.ready.wait(10)
    return handler, rec


def answers(rec) -> dict[str, str]:
    """question_id -> segment_complete outcome (error message for errors)."""
    out = {}
    for arr, md in rec.of("segment_complete"):
        assert md["question_id"] not in out, f"two answers for {md['question_id']}"
        out[md["question_id"]] = md.get("error", arr[0].as_py()) if arr[0].as_py() == "error" else arr[0].as_py()
    return out


def test_reset_cancels_exactly_the_texts_sent_before_it(monkeypatch):
    """dora delivers ``control`` late under a backlog: the text sent after the reset arrives before it. The
    reset cancels the texts sent before it (the one in flight, the queued one, and one that arrives after the
    reset), never the one sent after it."""
    engine = FakeEngine(hold=0.3)
    handler, rec = fake_handler(engine, monkeypatch)
    handler.on_input("text", pa.array(["first"]), at(0, question_id="first"))
    assert engine.started.wait(5)
    handler.on_input("text", pa.array(["queued"]), at(10, question_id="queued"))
    handler.on_input("text", pa.array(["after"]), at(30, question_id="after"))  # sent after the reset
    handler.on_input("control", pa.array(["reset"]), at(20))
    handler.on_input("text", pa.array(["late"]), at(15, question_id="late"))  # sent before it, arrives after
    rec.wait(lambda r: len(r.of("segment_complete")) == 4, 30)
    got = answers(rec)
    assert got == {"first": CANCELLED, "queued": CANCELLED, "late": CANCELLED, "after": "completed"}, got
    assert [t for t, _ in engine.spoken] == ["first", "after"]


def test_seq_orders_inputs_without_timestamps(monkeypatch):
    """Without dora's timestamp (dora 0.3.x) the sender's ``seq`` gives the order."""
    engine = FakeEngine(hold=0.3)
    handler, rec = fake_handler(engine, monkeypatch)
    handler.on_input("text", pa.array(["one"]), {"seq": 1, "question_id": "one"})
    assert engine.started.wait(5)
    handler.on_input("text", pa.array(["three"]), {"seq": 3, "question_id": "three"})
    handler.on_input("reset", pa.array([1]), {"seq": 2})
    rec.wait(lambda r: len(r.of("segment_complete")) == 2, 30)
    assert answers(rec) == {"one": CANCELLED, "three": "completed"}


def test_change_voice_applies_to_the_texts_sent_after_it(monkeypatch):
    engine = FakeEngine(hold=0.3)
    handler, rec = fake_handler(engine, monkeypatch)
    handler.on_input("text", pa.array(["t0"]), at(0, question_id="t0"))
    assert engine.started.wait(5)
    handler.on_input("text", pa.array(["t3"]), at(30, question_id="t3"))  # sent after the change, arrives first
    handler.on_input("control", pa.array(["change_voice:B"]), at(20))
    handler.on_input("text", pa.array(["t1"]), at(10, question_id="t1"))  # sent before it
    rec.wait(lambda r: len(r.of("segment_complete")) == 3, 30)
    assert engine.spoken == [("t0", "A"), ("t1", "A"), ("t3", "B")]
    # A text sent before the change that arrives after the change has run still speaks with the old voice.
    handler.on_input("text", pa.array(["t2"]), at(15, question_id="t2"))
    rec.wait(lambda r: len(r.of("segment_complete")) == 4, 30)
    assert engine.spoken[-1] == ("t2", "A")


def test_a_text_failing_while_a_reset_cancels_it_gets_one_status(monkeypatch):
    """The worker's failure path and a reset answer the same text at the same moment: the one that claims the
    job sends its status and segment_complete, the other sends nothing (28 of 1 000 got two ``error``)."""
    engine = FakeEngine(hold=0.0, fail={"boom"})
    handler = None
    rec = Recorder()
    raced = []

    def send(output, array, metadata):
        rec(output, array, metadata)
        if output == "status" and json.loads(array[0].as_py())["status"] == "error" and not raced:
            raced.append(1)  # the worker is answering the failure: a reset comes in now, on another thread
            t = threading.Thread(target=handler.on_input, args=("control", pa.array(["reset"]), {}))
            t.start()
            t.join(0.5)

    handler, _ = fake_handler(engine, monkeypatch, send=send)
    handler.on_input("text", pa.array(["boom"]), {"question_id": "boom"})
    rec.wait(lambda r: len(r.of("segment_complete")) == 1, 30)
    time.sleep(1.0)
    errors = [s for s in rec.statuses() if s["status"] == "error"]
    assert raced and len(errors) == 1, errors
    assert len(rec.of("segment_complete")) == 1


def test_cleanup_is_answered_off_the_input_thread(monkeypatch):
    engine = FakeEngine(hold=1.0)
    handler, rec = fake_handler(engine, monkeypatch)
    handler.on_input("text", pa.array(["speaking"]), {"question_id": "q"})
    assert engine.started.wait(5)
    t0 = time.perf_counter()
    handler.on_input("control", pa.array(["cleanup"]), {})
    handler.on_input("control", pa.array(["stats"]), {})
    assert time.perf_counter() - t0 < 0.2  # the input thread did not wait for the cleanup (1 s) or the text
    rec.wait(lambda r: any(s["status"] == "cleanup" for s in r.statuses()), 30)
    order = [s["status"] for s in rec.statuses() if s["status"] in ("stats", "done", "cleanup")]
    assert order == ["stats", "done", "cleanup"], order  # after the text's audio, never in the middle of it
    assert engine.cleanups == 1


# -- the real engine and front end -----------------------------------------------------------------------------

def oov_text(n_chars: int, seed: int = 0) -> str:
    """English "words" of 60 random letters (no dictionary has them: each goes through the compound splitter and
    the neural predictor, the slowest path of the front end) in sentences, about ``n_chars`` long."""
    rng = random.Random(seed)
    words = []
    while sum(len(w) + 2 for w in words) < n_chars:
        words.append("".join(rng.choice(string.ascii_lowercase) for _ in range(60)))
    return ". ".join(words) + "."


SLOW_TEXTS = {
    "oov-words": oov_text(4900),  # the slowest found: tens of seconds of front end
    "ordinals": " ".join(f"{n}. {n}th {n}:30 ${n}.{n % 100:02d} {n}/7" for n in range(1000, 1120)),
    "digits-3.": "3. " + "1" * 1600,  # issue 25's text: 16.7 s of blocked controls before
    "digits-5k": "9" * 4999,  # issue 24's: no answer in 200 s before
}


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    from dora_primespeech_mlx.node import engine_factory

    model_dir = make_model_dir(tmp_path_factory.mktemp("models"))
    from tiny_voice import VOICE

    settings = Settings.from_env({"VOICE_NAME": VOICE, "PRIMESPEECH_MODEL_DIR": str(model_dir),
                                  "GPTSVITS_WARMUP": "false", "TOP_K": "1"})
    return model_dir, engine_factory(settings)(lambda m: None)


_CONTROLS_RUN = """
import json, sys, time
import pyarrow as pa
from test_handler import make_handler
from test_order import SLOW_TEXTS
from dora_primespeech_mlx.node import engine_factory
from dora_primespeech_mlx.settings import Settings
from tiny_voice import VOICE
model_dir, name = sys.argv[1], sys.argv[2]
# warmed up as the node is before `ready` (the voice's models and reference are built then, not during the text)
settings = Settings.from_env({"VOICE_NAME": VOICE, "PRIMESPEECH_MODEL_DIR": model_dir, "TOP_K": "1"})
handler, rec = make_handler(model_dir, engine_factory(settings)(lambda m: None))
handler.on_input("text", pa.array([json.dumps({"prompt": SLOW_TEXTS[name], "language": "en"})]), {"question_id": name})
rec.wait(lambda r: any(s["status"] == "synthesizing" for s in r.statuses()), 30)
time.sleep(0.3)  # inside the front end now
latencies = []
for i in range(10):
    if handler.jobs.idle():
        break
    t0 = time.perf_counter()
    handler.on_input("control", pa.array(["stats" if i % 2 == 0 else "list_voices"]), {})
    latencies.append(time.perf_counter() - t0)
    time.sleep(0.1)
busy = not handler.jobs.idle()
t0 = time.perf_counter()
handler.on_input("control", pa.array(["reset"]), {})
answered = time.perf_counter() - t0
idle = handler.jobs.wait_idle(5.0)
freed = time.perf_counter() - t0
answers = [md for _, md in rec.of("segment_complete")]
print("RESULT " + json.dumps({"latencies": latencies, "busy": busy, "answered": answered, "idle": idle,
                              "freed": freed, "answers": answers}, default=str), flush=True)
"""


@pytest.mark.slow  # 12-15 s each (a child process with the real engine); the quick tier keeps the in-process
@pytest.mark.parametrize("name", SLOW_TEXTS)  # test_the_front_end_never_holds_the_gil_for_long
def test_controls_stay_prompt_and_reset_stops_the_front_end(real, name):
    """While the worker runs the real engine's text front end on a hostile text, ``stats`` and ``list_voices``
    are answered at once (nothing the worker runs holds the GIL for long), and a ``reset`` answers the text at
    once and frees the worker at the front end's next checkpoint. In a child process: one whose engine had a
    synthesis cancelled mid-way aborts at interpreter exit (MLX's thread teardown; also before these changes)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    model_dir, _ = real
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here.parents[1]), str(here.parent), str(here),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", _CONTROLS_RUN, str(model_dir), name], cwd=here, env=env,
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    r = json.loads(lines[0][7:])
    latencies, answers = r["latencies"], r["answers"]
    outcome = answers[0].get("error", "completed") if answers else None
    print(f"{name}: worst control latency {max(latencies, default=0) * 1000:.1f} ms over {len(latencies)} controls; "
          f"reset answered in {r['answered'] * 1000:.1f} ms, worker free {r['freed']:.2f} s after it "
          f"(busy at the reset: {r['busy']}); outcome: {outcome}")
    assert r["idle"] and len(answers) == 1
    # The node promises 100 ms; on a CPU shared with other work (this suite's machine: load 8 on 2 cores) the OS
    # alone delays a thread by more now and then, so the median is held to 100 ms and the worst to 1 s (before:
    # 9-17 s, and more than 200 s for 5 000 nines).
    if not latencies:  # the front end refused the text before the first control (a number inflect cannot read)
        assert outcome != "completed" and answers[0].get("error_stage") == "text"
        return
    assert sorted(latencies)[len(latencies) // 2] < 0.1, latencies
    assert max(latencies) < 1.0, latencies
    assert r["answered"] < 0.1
    assert r["freed"] < 3.0  # the front end's next checkpoint: after the word in hand (one neural prediction)
    if name == "oov-words":
        assert r["busy"] and outcome == CANCELLED  # the slowest text: the reset did stop it


def test_the_front_end_budget_is_an_error_naming_it(real):
    model_dir, pair = real
    engine = pair[0]
    engine.settings = Settings.from_env({**{k: str(v) for k, v in {}.items()}, "MAX_TEXT_SECONDS": "0.5"})
    try:
        handler, rec = make_handler(model_dir, pair)
        handler.on_input("text", pa.array([json.dumps({"prompt": SLOW_TEXTS["oov-words"], "language": "en"})]),
                         {"question_id": "budget"})
        rec.wait(lambda r: len(r.of("segment_complete")) == 1, 60)
        md = rec.of("segment_complete")[0][1]
        assert md["error_stage"] == "text" and "MAX_TEXT_SECONDS=0.5" in md["error"], md
    finally:
        engine.settings = Settings.from_env({})


@pytest.mark.parametrize("text,language", [("今天天气很好。", "en"), ("안녕하세요.", "zh"), ("こんにちは。", "en")])
def test_text_its_language_cannot_read_is_skipped(real, text, language):
    """Phones of punctuation only (Chinese as en: ", ."): skipped, not ~2 s of babble."""
    model_dir, engine = real
    handler, rec = make_handler(model_dir, engine)
    handler.on_input("text", pa.array([json.dumps({"prompt": text, "language": language})]), {"question_id": "x"})
    rec.wait(lambda r: len(r.of("segment_complete")) == 1, 60)
    assert rec.of("segment_complete")[0][0][0].as_py() == "skipped"
    assert all(md.get("silent") for _, md in rec.of("audio"))  # at most the skip's short silence


_STATS_RUN = """
import json, sys
import pyarrow as pa
from test_handler import LONG, make_handler
from dora_primespeech_mlx.node import engine_factory
from dora_primespeech_mlx.settings import Settings
from tiny_voice import VOICE
model_dir = sys.argv[1]
settings = Settings.from_env({"VOICE_NAME": VOICE, "PRIMESPEECH_MODEL_DIR": model_dir, "GPTSVITS_WARMUP": "false",
                              "TOP_K": "1"})
pair = engine_factory(settings)(lambda m: None)
handler, rec = make_handler(model_dir, pair)
for i in range(4):
    handler.on_input("text", pa.array([LONG]), {"question_id": f"q{i}"})
    rec.wait(lambda r, n=i + 1: sum(s["status"] == "synthesizing" for s in r.statuses()) == n, 60)
    handler.on_input("control", pa.array(["reset"]), {})  # inside the engine now
    assert handler.jobs.wait_idle(10)
handler.on_input("text", pa.array(["Hello world."]), {"question_id": "last"})
rec.wait(lambda r: len(r.of("segment_complete")) == 5, 120)
print("STATS " + json.dumps(pair[0].stats(), default=str), flush=True)
"""


@pytest.mark.slow  # a child process with the real engine, 8 s
def test_engine_stats_count_what_happened(real):
    """Cancelled requests are requests: no outcome count exceeds ``requests`` (205 cancelled vs 27 before). In a
    child process: one whose engine had a synthesis cancelled mid-way aborts at interpreter exit ("terminate
    called without an active exception", MLX's thread teardown; also before these changes)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    model_dir, _ = real
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here.parents[1]), str(here.parent), str(here),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", _STATS_RUN, str(model_dir)], cwd=here, env=env,
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("STATS ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    st = json.loads(lines[0][6:])
    print(f"engine stats over 4 texts reset mid-synthesis and 1 spoken: requests {st['requests']}, "
          f"cancelled {st['cancelled']}, failures {st['failures']}, skipped {st['skipped']}")
    assert st["cancelled"] >= 1 and st["requests"] == 5, st
    assert st["cancelled"] + st["failures"] + st["skipped"] <= st["requests"], st


def _worst_wake_up(work) -> float:
    """The longest another thread waited to wake from a 1 ms sleep while ``work`` ran (how long the GIL was
    held in one piece, plus the OS's own delays)."""
    stop, worst = threading.Event(), [0.0]

    def probe():
        while not stop.is_set():
            t = time.perf_counter()
            time.sleep(0.001)
            worst[0] = max(worst[0], time.perf_counter() - t - 0.001)

    thread = threading.Thread(target=probe)
    thread.start()
    try:
        work()
    except Exception:  # a refused text is fine: what counts is how long it held the GIL
        pass
    finally:
        stop.set()
        thread.join()
    return worst[0]


def _spin(seconds: float) -> None:
    """Plain Python work that holds the GIL only for the interpreter's switch interval at a time."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_the_front_end_never_holds_the_gil_for_long():
    """The text front end on the slowest texts found (and the ones that froze the node before) lets another thread
    run every few milliseconds: the input thread is never starved. The bound is relative to a calibration taken
    in the same test, so a busy machine moves both: the worst wake-up beside plain Python work of the same length
    (which gives the GIL up every switch interval) and beside an idle sleep."""
    import gc

    from dora_primespeech_mlx.text import preprocess

    preprocess("Hello qwzrtpxkvb world.", "en", data=DATA)  # loads what the front end loads once (dictionaries, model)
    # As the node does after loading its front ends (startup.freeze_front_ends): what is alive now (here also the test
    # process's own hundreds of thousands of objects) is frozen, so a full collection, which holds the GIL while it
    # walks them, is not counted as the front end's.
    gc.collect()
    gc.freeze()
    try:
        idle = _worst_wake_up(lambda: time.sleep(1.0))
        for name, text in SLOW_TEXTS.items():
            piece = text if name != "oov-words" else text[:1500]
            for _attempt in range(2):  # a loaded machine can stall one run: measured once more before failing
                t0 = time.perf_counter()
                busy = _worst_wake_up(lambda piece=piece: preprocess(piece, "en", data=DATA))
                took = time.perf_counter() - t0
                calibration = max(idle, _worst_wake_up(lambda took=took: _spin(max(took, 0.2))))
                print(f"{name}: {took:.2f} s of front end, worst wake-up {busy * 1000:.1f} ms (beside plain Python "
                      f"work {calibration * 1000:.1f} ms, idle {idle * 1000:.1f} ms)")
                if busy < 0.1 + calibration:
                    break
            assert busy < 0.1 + calibration, name
    finally:
        gc.unfreeze()


def test_outputs_do_not_echo_the_send_timestamp(monkeypatch):
    """dora keeps a sender's own ``timestamp`` metadata key instead of its send time: echoing the text's would make
    the answers (and texts a client sends with metadata copied from them) look as old as the text."""
    engine = FakeEngine()
    handler, rec = fake_handler(engine, monkeypatch)
    handler.on_input("text", pa.array(["hello"]), at(0, question_id="q", custom=1))
    rec.wait(lambda r: len(r.of("segment_complete")) == 1, 30)
    for output in ("segment_complete", "audio", "status"):
        for _, md in rec.of(output):
            assert "timestamp" not in md, (output, md)
    assert rec.of("segment_complete")[0][1]["custom"] == 1
