"""The way of one streamed fragment from ``text`` to ``audio``, recorded: which of the package's modules it passes,
on which threads, and that the runtime wiring has no climbs back up (issue 53's "Done when").

A handler with the REAL engine on the fixture voice (tests/node/tiny_voice.py) is given one fragment (``session_id``,
``segment_id``, ``seq`` 0, ``fin``: an utterance of one fragment, spoken streamed) while ``sys.setprofile`` and
``threading.setprofile`` record every call into a frame of the package: its thread, its module and the package
modules on that thread's call stack beneath it. Recording stops at the utterance's ``segment_complete``.

What is asserted, and at which granularity:

- **No callback round trip between the node side and the engine**: no frame of ``dataflow/`` code runs while a frame
  of ``engine/`` code is beneath it on the same thread. The node calls the engine (and iterates its stream); the
  engine reads what the node pushed (the queue and the playback clock, ``board.py``) and never calls node code.
- **No module entered twice**: a module is *entered* when a frame of it is called from a frame of another module; it
  is *entered twice* when it is entered while a frame of it is still on the stack beneath, with another module
  between (A -> B -> A): the flow moved on to a later stage and that stage climbed back into an earlier one (a
  callback, or a helper that lives in the stage before). The unit is the module (one file), the stack is one
  thread's, collapsed where consecutive frames are of the same module. A stage that runs again for the next piece of
  the same fragment (the next audio chunk: speech -> engine, then speech -> outputs, chunk after chunk) is the flow
  going forward again with new data, not a climb back, and is allowed. Only the package's own frames count
  (``threading``, ``numpy`` and MLX between two of them are transparent).
- **Threads as the design has them**: the input thread runs the handler's routing (``on_input``) and hands the
  fragment to the intake queue; the intake thread assembles it (utterance -> sentences -> LLM text stage ->
  admission -> the job queue); the worker speaks it (job -> speech -> the engine -> outputs -> transport). Node code
  (``dataflow/``) of the fragment runs on exactly these 3 threads; any thread the engine starts for itself (its CPU
  probe, its vocoder lane) runs no node code, and the worker's supervisor runs only its watch (``dataflow/worker``).

The test also checks that the recording is not empty of what it judges: the fragment's stages appear, each on its
thread, in the order of their first call there.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from tiny_voice import VOICE, e2e_case, make_model_dir

import dora_primespeech_mlx
from dora_primespeech_mlx.dataflow.handler import MessageHandler
from dora_primespeech_mlx.dataflow.transport import DirectTransport
from dora_primespeech_mlx.node import engine_factory
from dora_primespeech_mlx.settings import Settings

PACKAGE_DIR = str(Path(dora_primespeech_mlx.__file__).resolve().parent) + os.sep

# the fragment's stages: the call that hands its data to each, in the order its data passes them, and its thread
STAGES = [
    ("dataflow.handler", "on_input", "input"),
    ("dataflow.intake", "put_fragment", "input"),
    ("dataflow.intake", "_work", "intake"),
    ("dataflow.utterance", "accept", "intake"),
    ("dataflow.sentences", "push", "intake"),
    ("dataflow.admission", "sentence", "intake"),
    ("dataflow.jobs", "put", "intake"),
    ("dataflow.speech", "run", "worker"),
    ("engine.core", "synthesize_stream", "worker"),
    ("engine.stream", "__iter__", "worker"),
    ("dataflow.outputs", "audio", "worker"),
    ("dataflow.answers", "complete", "worker"),
]
# passed too, in no fixed place among the first calls: the worker waits in ``get`` from before the recording starts,
# and the transport sends the ``synthesizing`` status before the engine runs
ALSO = [("dataflow.jobs", "get", "worker"), ("dataflow.transport", "send", "worker")]
THREADS = {"input": None, "intake": "primespeech-intake", "worker": "primespeech-worker"}  # None: the test's own
SUPERVISOR = "primespeech-supervisor"


def module_of(code) -> str | None:
    """The package module (``dataflow.speech``) of a code object, None outside the package."""
    f = code.co_filename
    if not f.startswith(PACKAGE_DIR) or not f.endswith(".py"):
        return None
    name = f[len(PACKAGE_DIR):-3].replace(os.sep, ".")
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


class Recording:
    """Every call into the package's frames: (thread name, module, function, the package modules on the stack from
    the bottom up, consecutive repeats collapsed, the called one last)."""

    def __init__(self):
        self.calls: list[tuple[str, str, str, tuple[str, ...]]] = []
        self.lock = threading.Lock()
        self.on = False

    def __call__(self, frame, event, arg):
        if event != "call" or not self.on:
            return
        m = module_of(frame.f_code)
        if m is None:
            return
        stack: list[str] = []
        f = frame
        while f is not None:
            mm = module_of(f.f_code)
            if mm is not None and (not stack or stack[-1] != mm):
                stack.append(mm)
            f = f.f_back
        with self.lock:
            self.calls.append((threading.current_thread().name, m, frame.f_code.co_name, tuple(reversed(stack))))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("models"))


def record_one_fragment(model_dir) -> tuple[Recording, list[str]]:
    env = {"VOICE_NAME": VOICE, "PRIMESPEECH_MODEL_DIR": str(model_dir), "TOP_K": "1", "GPTSVITS_WARMUP": "false",
           "STREAMING": "true"}
    settings = Settings.from_env(env)
    engine = engine_factory(settings)(lambda message: None)
    sent, cv = [], threading.Condition()

    def send(output, array, metadata):
        with cv:
            sent.append(output)
            cv.notify_all()

    handler = MessageHandler(settings, lambda progress: engine, DirectTransport(send))
    rec = Recording()
    threading.setprofile(rec)  # the handler's threads, started below
    sys.setprofile(rec)
    try:
        handler.start()
        assert handler.ready.wait(60) and handler.startup_error is None
        # the same text once, unrecorded: what a first use loads (an encoder the voice's load leaves for the first
        # text of its language, e.g. RoBERTa when the reference features come from the disk cache) is the start's
        # work, not the fragment's way, and with the warm-up off it would fall into the recording
        handler.on_input("text", pa.array([e2e_case()["inputs"]["text"]]),
                         {"session_id": "s", "segment_id": 0, "seq": 0, "fin": True})
        with cv:
            assert cv.wait_for(lambda: "segment_complete" in sent, 120), "no answer to the unrecorded text"
        sent.clear()
        rec.on = True
        handler.on_input("text", pa.array([e2e_case()["inputs"]["text"]]),
                         {"session_id": "s", "segment_id": 1, "seq": 0, "fin": True})
        with cv:
            assert cv.wait_for(lambda: "segment_complete" in sent, 120), "no answer"
        rec.on = False
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
        rec.on = False
        handler.finish(60)
    return rec, list(sent)


def test_a_streamed_fragment_goes_from_text_to_audio_without_climbing_back(model_dir):
    rec, sent = record_one_fragment(model_dir)
    assert sent.count("audio") >= 2, f"not streamed in pieces: {sent}"  # (a stream: several chunks)
    me = threading.current_thread().name
    names = {k: (me if v is None else v) for k, v in THREADS.items()}

    # the recording holds the fragment's way: every stage, on its thread, first entered in this order
    first: dict[tuple[str, str, str], int] = {}  # (module, function, thread) -> its first call
    for i, (thread, module, function, _) in enumerate(rec.calls):
        first.setdefault((module, function, thread), i)
    missing = [f"{m}.{fn} on the {where} thread" for m, fn, where in STAGES + ALSO
               if (m, fn, names[where]) not in first]
    assert not missing, f"stages never entered: {missing}"
    at = [first[m, fn, names[where]] for m, fn, where in STAGES]
    assert at == sorted(at), "the stages' first calls out of order: " + ", ".join(
        f"{m}.{fn}" for _, (m, fn, _) in sorted(zip(at, STAGES)))

    # (a) no callback round trip: no node frame with an engine frame beneath it
    round_trips = sorted({" -> ".join(stack) + f" ({fn})" for _, m, fn, stack in rec.calls
                          if m.startswith("dataflow.") and any(s.startswith("engine.") for s in stack)})
    assert not round_trips, "the engine called node code:\n" + "\n".join(round_trips)

    # (b) no module entered twice: no module re-entered above a frame of its own with another module between
    climbs = sorted({f"[{thread}] " + " -> ".join(stack) + f" ({fn})" for thread, _, fn, stack in rec.calls
                     if len(set(stack)) != len(stack)})
    assert not climbs, "a module entered again while the flow is still inside it:\n" + "\n".join(climbs)

    # threads: node code on exactly the input, intake and worker threads (the supervisor: its watch only); the
    # engine's own threads run no node code
    node_threads = {thread for thread, m, _, _ in rec.calls if m.startswith("dataflow.") and thread != SUPERVISOR}
    assert node_threads == set(names.values()), sorted(node_threads)
    supervisor = {m for thread, m, _, _ in rec.calls if thread == SUPERVISOR}
    assert supervisor <= {"dataflow.worker"}, sorted(supervisor)
    engine_threads = {thread for thread, m, _, _ in rec.calls if m.startswith("engine.")}
    assert engine_threads & set(names.values()) == {names["worker"]}, sorted(engine_threads)
