"""A text queued while the node starts cuts the warm-up synthesis short (engine/startup.py, ``StartProgress``):
the first text waits for the models, not for the warm-up; with nothing queued the warm-up runs whole."""

from __future__ import annotations

import json
import threading

import pyarrow as pa
from tiny_voice import VOICE, make_model_dir

from dora_primespeech_mlx.assets.catalog import resolve_voice
from dora_primespeech_mlx.dataflow.handler import MessageHandler
from dora_primespeech_mlx.dataflow.transport import DirectTransport
from dora_primespeech_mlx.engine import GPTSoVITSEngine
from dora_primespeech_mlx.node import engine_factory
from dora_primespeech_mlx.settings import Settings


def _synthesized(engine) -> bool:
    """Whether the engine has measured a GPT speed (a synthesis ran and decoded tokens)."""
    return engine.rates.token_s is not None


def test_warmup_skips_or_stops_its_synthesis_when_cancelled(tmp_path):
    root = make_model_dir(tmp_path / "models")
    spec = resolve_voice(VOICE, root)
    whole = GPTSoVITSEngine(model_dir=root)
    whole.load_voice(spec)
    whole.warmup(cancel=threading.Event())
    assert _synthesized(whole), "nothing waiting: the warm-up synthesizes"

    skipped = GPTSoVITSEngine(model_dir=root)
    skipped.load_voice(spec)
    waiting = threading.Event()
    waiting.set()
    front_ends = skipped.warmup(cancel=waiting)
    assert set(front_ends), "the front ends are loaded all the same"
    assert not _synthesized(skipped)

    stopped = GPTSoVITSEngine(model_dir=root)
    stopped.load_voice(spec)
    arrives = threading.Event()
    real = stopped._prepare

    def prepare(*a, **kw):  # the text arrives once the warm-up's synthesis has begun
        r = real(*a, **kw)
        arrives.set()
        return r

    stopped._prepare = prepare
    stopped.warmup(cancel=arrives)
    assert arrives.is_set() and not _synthesized(stopped), "cut short before its tokens were measured"
    st = stopped.stats()
    assert (st["requests"], st["failures"], st.get("cancelled", 0)) == (0, 0, 0), "the warm-up is not a request"
    assert len(stopped.synthesize("Hello.", fragment_interval=0.0).audio) > 0


class Log:
    def __init__(self):
        self.sent, self.lock = [], threading.Lock()

    def __call__(self, output, array, metadata):
        with self.lock:
            self.sent.append((output, array[0].as_py() if len(array) else None))

    def logs(self) -> list[str]:
        with self.lock:
            return [json.loads(v)["message"] if v.startswith("{") else v for o, v in self.sent if o == "log"]

    def statuses(self) -> list[str]:
        with self.lock:
            return [json.loads(v)["status"] for o, v in self.sent if o == "status"]


def _handler(root, gate: threading.Event):
    settings = Settings.from_env({"VOICE_NAME": VOICE, "PRIMESPEECH_MODEL_DIR": str(root), "TOP_K": "1",
                                  "GPTSVITS_WARMUP": "true", "LOG_LEVEL": "INFO"})
    real = engine_factory(settings)

    def build(progress):
        gate.wait(60)
        return real(progress)

    log = Log()
    handler = MessageHandler(settings, build, DirectTransport(log))
    handler.start()
    return handler, log


def test_a_text_sent_during_the_start_cuts_the_warmup_short(tmp_path):
    root = make_model_dir(tmp_path / "models")
    gate = threading.Event()
    handler, log = _handler(root, gate)
    handler.on_input("text", pa.array(["Hello."]), {})
    assert handler.jobs.text_arrived.wait(30), "the text is queued while the engine is built"
    gate.set()
    assert handler.ready.wait(600) and handler.startup_error is None
    assert handler.finish(120)
    warmups = [m for m in log.logs() if "warm-up done" in m]
    assert len(warmups) == 1 and "cut short" in warmups[0], warmups
    assert log.statuses().count("done") == 1


def test_without_a_text_the_warmup_runs_whole(tmp_path):
    root = make_model_dir(tmp_path / "models")
    gate = threading.Event()
    gate.set()
    handler, log = _handler(root, gate)
    assert handler.ready.wait(600) and handler.startup_error is None
    assert _synthesized(handler.engine)
    warmups = [m for m in log.logs() if "warm-up done" in m]
    assert len(warmups) == 1 and "cut short" not in warmups[0], warmups
    assert handler.finish(60)
