"""SIGTERM and SIGINT on the node form (``dora-primespeech-mlx``), run as a subprocess with a stand-in for dora
(tests/node/fake_dora): the text in flight and the queued ones are answered as cancelled, as on STOP, and the
node exits with code 0 within a second, whether the worker sends (dora 1.x) or the main thread does (0.3.x), also
during the start-up (tests/node/slow_start_node.py).
And the operator form's STOP with a worker stuck in the engine: answered at once, gone within a second."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from tiny_voice import VOICE, make_model_dir

from dora_primespeech_mlx.dataflow.handler import STOPPING
from dora_primespeech_mlx.errors import SynthesisCancelled

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
LONG = " ".join(f"Sentence number {n}, a small test of stopping." for n in range(1, 60))


def _outputs(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _start(tmp_path: Path, events: list[dict], sends: str, argv: list[str], **env) -> tuple[subprocess.Popen, Path]:
    """The node form under the stand-in for dora (tests/node/fake_dora), the tiny voice, outputs to a file."""
    model_dir = make_model_dir(tmp_path / "models")
    out = tmp_path / "out.jsonl"
    env = {**os.environ, "FAKE_DORA_EVENTS": json.dumps(events), "FAKE_DORA_OUT": str(out),
           "PYTHONPATH": os.pathsep.join([str(HERE / "fake_dora"), str(REPO), os.environ.get("PYTHONPATH", "")]),
           "VOICE_NAME": VOICE, "PRIMESPEECH_MODEL_DIR": str(model_dir), "GPTSVITS_WARMUP": "false",
           "STREAMING": "true", "PRIMESPEECH_DORA_SENDS": sends, **env}
    env.pop("DORA_NODE_CONFIG", None)
    proc = subprocess.Popen([sys.executable, *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    return proc, out


def _signal_and_wait(proc: subprocess.Popen, out: Path, until, what: str, signum: int) -> tuple[int, float, str]:
    """Wait until ``until(outputs)`` (at most 300 s), send ``signum``; (exit code, seconds to the exit, output)."""
    try:
        deadline = time.monotonic() + 300
        while not until(_outputs(out)):
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, f"no {what} within 300 s"
            time.sleep(0.05)
        t0 = time.monotonic()
        proc.send_signal(signum)
        rc = proc.wait(timeout=30)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return rc, elapsed, proc.stdout.read()


def _calibration() -> float:
    """How long this machine takes now to start and reap a bare Python process (the scheduling noise that the
    exit seen from here includes)."""
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.monotonic() - t0


def _check_stopped(rc: int, log: str, out: Path, name: str, texts: int, elapsed: float, calibration: float) -> None:
    assert rc == 0, log[-3000:]
    done = [o for o in _outputs(out) if o["id"] == "segment_complete"]
    assert [o["metadata"]["t"] for o in done] == list(range(texts)), log[-3000:]
    assert all(o["values"] == ["error"] and o["metadata"]["error"] == STOPPING for o in done)
    (after,) = re.findall(rf"{name}: {texts} text\(s\) answered as cancelled; exiting (\d+\.\d+) s after", log)
    assert float(after) < 1.0  # measured by the node from the signal's arrival
    assert "KeyboardInterrupt" not in log and "Traceback" not in log, log[-3000:]
    assert elapsed < 1.0 + 2 * calibration, (elapsed, calibration)  # the process is gone, seen from here


@pytest.mark.parametrize("sends", ["worker", "main"])
@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_a_signal_answers_every_text_and_exits_at_once(tmp_path, sends, name):
    """SIGTERM, and SIGINT alike (it raised KeyboardInterrupt out of ``next()``: no answer, exit code 1)."""
    events = [{"id": "text", "value": LONG, "metadata": {"t": i}} for i in range(4)]
    proc, out = _start(tmp_path, events, sends, ["-c", "import sys; from dora_primespeech_mlx.node import main; "
                                                       "sys.exit(main())"])
    rc, elapsed, log = _signal_and_wait(proc, out, lambda outs: any(o["id"] == "audio" for o in outs),
                                        "audio", getattr(signal, name))  # the first text streams now
    calibration = _calibration()
    print(f"sends from the {sends}: the process ended {elapsed:.2f} s after {name} (rc {rc}; a bare Python "
          f"process takes {calibration:.2f} s)")
    _check_stopped(rc, log, out, name, 4, elapsed, calibration)


@pytest.mark.parametrize("sends", ["worker", "main"])
@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_a_signal_during_the_start_up_answers_the_texts_received_meanwhile(tmp_path, sends, name):
    """The node reads its inputs while the start voice loads: the texts sent then are queued, and a signal before
    the start-up ends answers them all and ends the node within a second (before, the main thread read no event
    until the voice was loaded: 0 of 3 answered)."""
    from slow_start_node import STILL_STARTING

    events = [{"id": "text", "value": f"Text number {i}.", "metadata": {"t": i}} for i in range(3)]
    proc, out = _start(tmp_path, events, sends, [str(HERE / "slow_start_node.py")], SLOW_START_S="120")
    rc, elapsed, log = _signal_and_wait(
        proc, out, lambda outs: any(o["id"] == "log" and STILL_STARTING in o["values"][0] for o in outs),
        "voice load", getattr(signal, name))
    calibration = _calibration()
    print(f"sends from the {sends}: the process ended {elapsed:.2f} s after {name} during the start-up (rc {rc}; "
          f"a bare Python process takes {calibration:.2f} s)")
    assert not [o for o in _outputs(out) if o["id"] == "status" and '"ready"' in o["values"][0]]  # still starting
    _check_stopped(rc, log, out, name, 3, elapsed, calibration)


class StuckEngine:
    """An engine whose synthesis ignores cancellation for a long while (a long SoVITS step on a loaded CPU)."""

    def __init__(self):
        self.started = threading.Event()

    def synthesize(self, text, voice=None, cancel=None, **kw):
        self.started.set()
        threading.Event().wait(30)
        raise SynthesisCancelled("late")

    def stats(self):
        return {}


def test_operator_stop_leaves_within_a_second_when_the_worker_is_stuck(monkeypatch):
    """The operator form waited up to 60 s for the worker; now it answers, waits STOP_GRACE_S, then leaves."""
    from types import SimpleNamespace

    import pyarrow as pa

    from dora_primespeech_mlx import node

    engine = StuckEngine()
    monkeypatch.setattr(node, "engine_factory", lambda settings: lambda progress: (
        engine, SimpleNamespace(name="Fake", language="en")))
    monkeypatch.setenv("STREAMING", "false")
    exits = []

    def fake_exit(code):
        exits.append((code, time.monotonic()))
        raise SystemExit(code)

    monkeypatch.setattr(node.serve.os, "_exit", fake_exit)  # (serve.leave: the one way out)
    sent = []
    op = node.Operator()
    send = lambda output, array, md: sent.append((output, array.to_pylist(), md))  # noqa: E731
    op.on_event({"type": "INPUT", "id": "tick", "value": pa.array([0]), "metadata": {}}, send)  # a heartbeat
    op.on_event({"type": "INPUT", "id": "text", "value": pa.array(["Hello."]), "metadata": {"t": 0}}, send)
    op.on_event({"type": "INPUT", "id": "text", "value": pa.array(["Again."]), "metadata": {"t": 1}}, send)
    assert engine.started.wait(10)
    t0 = time.monotonic()
    with pytest.raises(SystemExit):
        op.on_event({"type": "STOP"}, send)
    assert exits and exits[0][0] == 0 and exits[0][1] - t0 < 1.5
    done = [(a, m["t"]) for o, a, m in sent if o == "segment_complete"]
    assert done == [(["error"], 0), (["error"], 1)]
    assert all(m["error"] == STOPPING for o, _, m in sent if o == "segment_complete")
