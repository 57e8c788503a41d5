"""The node's process without dora (dataflow/serve.py), with a fake engine whose build waits for the test: inputs
are taken while the start voice loads (texts wait in the queue, ``stats`` waits for the engine), ``status: ready``
goes out before anything else the engine does, and a start that fails is reported, answers every text received
meanwhile and ends the node with code 2. (The real start-up under signals and STOP: test_sigterm.py,
test_dora_stop.py.)"""

from __future__ import annotations

import json
import threading

import pyarrow as pa
from test_reliability import VOICE, FakeEngine, Recorder

from dora_primespeech_mlx.dataflow.cancellation import STOPPING
from dora_primespeech_mlx.dataflow.serve import Service
from dora_primespeech_mlx.settings import Settings


def _service(build, direct=True):
    rec = Recorder()
    settings = Settings.from_env({"LOG_LEVEL": "DEBUG", "GPTSVITS_WARMUP": "false"})
    service = Service(settings, build, rec, direct)
    service.handler.start()  # (Service.start also installs the signal handlers: not in the test process)
    return service, rec


def _order(rec) -> list[str]:
    out = []
    for output, array, _ in list(rec.sent):
        if output == "status":
            out.append(json.loads(array[0].as_py())["status"])
        elif output == "segment_complete":
            out.append(f"answer {array[0].as_py()}")
    return out


def test_inputs_during_the_start_up_wait_for_the_engine():
    gate = threading.Event()
    engine = FakeEngine()

    def build(progress):
        assert gate.wait(10)
        return engine, VOICE

    service, rec = _service(build)
    try:
        service.handler.on_input("text", pa.array(["Hello."]), {"t": 0})
        service.handler.on_input("control", pa.array(["stats"]), {"control_id": "s"})
        assert not service.handler.ready.is_set() and _order(rec) == []  # no "not ready" error, no answer yet
        gate.set()
        rec.wait(lambda r: len(r.of("segment_complete")) == 1)
        assert _order(rec)[:3] == ["ready", "stats", "synthesizing"] and _order(rec)[-1] == "answer completed"
    finally:
        service.handler.stop()


def test_a_failed_start_answers_the_texts_received_meanwhile_and_ends_with_code_2():
    gate = threading.Event()

    def build(progress):
        assert gate.wait(10)
        raise FileNotFoundError("no such voice file: /nowhere/voice.ckpt")

    service, rec = _service(build, direct=False)  # (direct: the worker would leave the process itself)
    service.handler.on_input("text", pa.array(["Hello."]), {"t": 0})
    service.handler.on_input("text", pa.array(["Again."]), {"t": 1})
    gate.set()
    assert service.handler.ready.wait(10)
    assert service.ending is not None and service.ending[0] == "start failure"
    assert service.stop(*service.ending) == 2
    service.flush()
    statuses = rec.statuses()
    assert statuses[0]["status"] == "error" and statuses[0]["error_stage"] == "init"
    assert "no such voice file" in statuses[0]["message"]
    answers = [(a[0].as_py(), m["t"], m["error"]) for a, m in rec.of("segment_complete")]
    assert answers == [("error", 0, STOPPING), ("error", 1, STOPPING)]
