"""SIGTERM on the node form (``dora-primespeech-mlx``), run as a subprocess with a stand-in for dora
(tests/node/fake_dora): the text in flight and the queued ones are answered as cancelled, as on STOP, and the
node exits with code 0 within a second, whether the worker sends (dora 1.x) or the main thread does (0.3.x).
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


_CALIBRATION = """
import signal, sys, time
import numpy, pyarrow
import dora_primespeech_mlx.node
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
print("ready", flush=True)
time.sleep(60)
"""


def _exit_calibration(env: dict) -> float:
    """Seconds from SIGTERM to the end of a process that imported what the node imports and exits at once on it:
    what the machine, as loaded as it is now, takes for a process to end."""
    proc = subprocess.Popen([sys.executable, "-c", _CALIBRATION], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        return time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("sends", ["worker", "main"])
def test_sigterm_answers_every_text_and_exits_at_once(tmp_path, sends):
    model_dir = make_model_dir(tmp_path / "models")
    out = tmp_path / "out.jsonl"
    events = [{"id": "text", "value": LONG, "metadata": {"t": i}} for i in range(4)]
    env = {**os.environ, "FAKE_DORA_EVENTS": json.dumps(events), "FAKE_DORA_OUT": str(out),
           "PYTHONPATH": os.pathsep.join([str(HERE / "fake_dora"), str(REPO), os.environ.get("PYTHONPATH", "")]),
           "VOICE_NAME": VOICE, "PRIMESPEECH_MODEL_DIR": str(model_dir), "GPTSVITS_WARMUP": "false",
           "STREAMING": "true", "PRIMESPEECH_DORA_SENDS": sends}
    env.pop("DORA_NODE_CONFIG", None)
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from dora_primespeech_mlx.node import main; "
                             "sys.exit(main())"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while not any(o["id"] == "audio" for o in _outputs(out)):  # the first text streams now
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "no audio within 300 s"
            time.sleep(0.05)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = proc.stdout.read()
    calibration = _exit_calibration(env)
    print(f"sends from the {sends}: the process ended {elapsed:.2f} s after SIGTERM (rc {rc}); a process that "
          f"exits at once on it: {calibration:.2f} s")
    assert rc == 0, log[-3000:]
    done = [o for o in _outputs(out) if o["id"] == "segment_complete"]
    assert [o["metadata"]["t"] for o in done] == [0, 1, 2, 3], log[-3000:]
    assert all(o["values"] == ["error"] and o["metadata"]["error"] == STOPPING for o in done)
    (after,) = re.findall(r"SIGTERM: 4 text\(s\) answered as cancelled; exiting (\d+\.\d+) s after", log)
    assert float(after) < 1.0
    # the process is gone within a second plus what a process's exit takes on this machine now (measured beside)
    assert elapsed < 1.0 + max(0.5, calibration)


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

    monkeypatch.setattr(node.os, "_exit", fake_exit)
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
