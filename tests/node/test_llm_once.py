"""The LLM text stage (``PRIMESPEECH_LLM_TEXT``) runs once per text: in the node, the dataflow's intake runs it (per
session, across messages) and the engine is told not to run it again; the engine used directly (the Python API) and
``primespeech-mlx say`` run it once themselves. Counted with the real engine and the tiny voice: every pass of the
stage over a text goes through :meth:`StreamFilter.feed` (``clean`` is a one-message filter), so each text's marker
must reach ``feed`` exactly once."""

from __future__ import annotations

import json
import re
import threading
from collections import Counter

import pyarrow as pa
import pytest
from conftest import text_data_env
from tiny_voice import VOICE, e2e_case, make_model_dir

from dora_primespeech_mlx.dataflow.handler import MessageHandler
from dora_primespeech_mlx.dataflow.serve import engine_factory
from dora_primespeech_mlx.dataflow.transport import DirectTransport
from dora_primespeech_mlx.settings import Settings
from dora_primespeech_mlx.text import llm

MARKER = re.compile(r"\b\d{4}\b")


class Passes:
    """Counts the passes of the LLM text stage over each marker (a four-digit number in the text)."""

    def __init__(self, monkeypatch):
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()
        feed = llm.StreamFilter.feed

        def counted(filt, text):
            with self.lock:
                self.counts.update(set(MARKER.findall(text)))
            return feed(filt, text)

        monkeypatch.setattr(llm.StreamFilter, "feed", counted)


class Recorder:
    def __init__(self):
        self.answers: list[tuple[str, dict]] = []
        self.cond = threading.Condition()

    def __call__(self, output, array, metadata):
        if output == "segment_complete":
            with self.cond:
                self.answers.append((array[0].as_py(), dict(metadata)))
                self.cond.notify_all()

    def wait(self, n: int, timeout: float = 300) -> list[tuple[str, dict]]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.answers) >= n, timeout), self.answers
            return list(self.answers)


def _text(marker: str) -> str:
    return f"<think>The user wants a test.</think>**{e2e_case()['inputs']['text']}** {marker}."


@pytest.mark.parametrize("streaming", ["true", "false"])
def test_the_node_runs_the_llm_stage_once_per_text(tmp_path, monkeypatch, streaming):
    """Plain texts queued back to back (with streaming they join one decode batch: the engine prepares the queued
    ones ahead), a JSON payload, and an utterance streamed in fragments."""
    passes = Passes(monkeypatch)
    settings = Settings.from_env({"VOICE_NAME": VOICE, "PRIMESPEECH_MODEL_DIR": str(make_model_dir(tmp_path)),
                                  "GPTSVITS_WARMUP": "false", "TOP_K": "1", "STREAMING": streaming,
                                  "PRIMESPEECH_LLM_TEXT": "true", **text_data_env()})
    rec = Recorder()
    handler = MessageHandler(settings, engine_factory(settings), DirectTransport(rec))
    handler.start()
    try:
        assert handler.ready.wait(300) and handler.startup_error is None, handler.startup_error
        plain = ["1111", "2222", "3333"]
        for i, marker in enumerate(plain):
            handler.on_input("text", pa.array([_text(marker)]), {"session_id": "s", "question_id": "q", "t": i})
        handler.on_input("text", pa.array([json.dumps({"prompt": _text("4444")})]),
                         {"session_id": "s", "question_id": "q", "t": 3})
        fragments = ["<think>seg", "ment 9999</think>", e2e_case()["inputs"]["text"][:7],
                     e2e_case()["inputs"]["text"][7:] + " 5555", "."]
        for seq, fragment in enumerate(fragments):
            handler.on_input("text", pa.array([fragment]), {"session_id": "u", "segment_id": 1, "seq": seq,
                                                           "fin": seq == len(fragments) - 1, "t": 4})
        answers = rec.wait(5)
        assert [a for a, _ in answers] == ["completed"] * 5, answers
        assert {m: passes.counts[m] for m in plain + ["4444", "5555"]} == dict.fromkeys(plain + ["4444", "5555"], 1)
    finally:
        handler.stop()


def test_the_engine_used_directly_runs_it_once(tmp_path, monkeypatch):
    """The Python API cleans an LLM's text by default (docs/python-api.md), once per call."""
    from dora_primespeech_mlx.engine.startup import start_engine

    settings = Settings.from_env({"VOICE_NAME": VOICE, "PRIMESPEECH_MODEL_DIR": str(make_model_dir(tmp_path)),
                                  "GPTSVITS_WARMUP": "false", "TOP_K": "1", **text_data_env()})
    engine, _ = start_engine(settings, lambda m: None)
    passes = Passes(monkeypatch)
    assert engine.synthesize(_text("6666")).audio.size
    assert sum(c.audio.size for c in engine.synthesize_stream(_text("7777"))) > 0
    assert engine.synthesize(_text("8888"), llm_text=False).audio.size
    assert passes.counts == Counter({"6666": 1, "7777": 1})


def test_say_runs_it_once(tmp_path, monkeypatch):
    """``primespeech-mlx say`` checks that something is left to speak after the stage and speaks that text (it ran
    the stage a second time in the engine)."""
    from dora_primespeech_mlx.cli import main

    model_dir = make_model_dir(tmp_path / "models")
    monkeypatch.setenv("PRIMESPEECH_LLM_TEXT", "true")
    for key, value in text_data_env().items():
        monkeypatch.setenv(key, value)
    passes = Passes(monkeypatch)
    assert main(["say", _text("1234"), "--voice", VOICE, "--model-dir", str(model_dir), "--output",
                 str(tmp_path / "out.wav"), "--top-k", "1"]) == 0
    assert passes.counts == Counter({"1234": 1})
