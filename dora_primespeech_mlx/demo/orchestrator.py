"""LLM-orchestrator stand-in for dora-primespeech-mlx.

It behaves like an LLM front end that streams its answer sentence by sentence without waiting for the
speech, and drives the TTS node's ``control`` input: voices and stats, a barge-in (``reset``) during the first
answer, a voice change and a second answer (:func:`converse` lists the steps).

Outputs: ``text``, ``control``, ``done``. Inputs: ``audio``, ``segment_complete`` and ``status`` of the
TTS node. Needs dora-rs >= 1.0 (a reader thread waits for events while the main thread sends).
Env: ``ANSWER_1``, ``ANSWER_2``, ``VOICE_2``, ``STREAM_DELAY`` (default 0.05),
``WAIT_TIMEOUT`` (default 120).

When the TTS node reports on ``status`` that it cannot start, the orchestrator ends with one line (exit code 0):
the TTS node's own message says what is wrong. Console script: ``primespeech-demo-orchestrator``."""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time

import pyarrow as pa
from dora import Node

from dora_primespeech_mlx.demo.tts_status import TTSNotStarted, ended_line, start_failure

ANSWER_1 = "让我想一想。|这个问题有很多方面。|首先，我们要看历史。|其次，还要看现在的情况。"
ANSWER_2 = "好的，我换一个声音来回答。|今天是个好日子。"


class Orchestrator:
    def __init__(self, node: Node):
        self.node = node
        # A reader thread waits in the blocking next() (dora-rs 1.1's next(timeout) can lose events) while
        # this thread sends; dora-rs >= 1.0 allows that.
        self.events: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.timeout = float(os.environ.get("WAIT_TIMEOUT", "120"))
        self.delay = float(os.environ.get("STREAM_DELAY", "0.05"))
        self.completes: dict[tuple[str, str], str] = {}
        self.reports: dict[tuple[str, str], dict] = {}  # the segment_complete metadata (what went out)
        self.history: list[dict] = []  # the conversation as the listener heard it
        self.first_audio: set[str] = set()
        self.answers: list[dict] = []
        self.control_id = 0

    def _read(self) -> None:
        while True:
            event = self.node.next()
            self.events.put(event)
            if event is None:
                return

    def _next(self, timeout: float):
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            return {"type": "TIMEOUT"}

    def _handle(self, event: dict) -> None:
        if event["type"] != "INPUT":
            return
        md = event.get("metadata") or {}
        if event["id"] == "segment_complete":
            key = (str(md.get("question_id")), str(md.get("segment_index")))
            self.completes[key] = event["value"][0].as_py()
            self.reports[key] = dict(md)
        elif event["id"] == "audio":
            self.first_audio.add(str(md.get("question_id")))
        elif event["id"] == "status":
            try:
                self.answers.append({"body": json.loads(event["value"][0].as_py()), "metadata": md})
            except (ValueError, TypeError, IndexError):
                return
            failure = start_failure(self.answers[-1]["body"])
            if failure is not None:
                raise TTSNotStarted(failure)

    def wait(self, until, what: str) -> None:
        deadline = time.monotonic() + self.timeout
        while not until():
            if time.monotonic() > deadline:
                raise SystemExit(f"orchestrator: gave up waiting for {what}")
            event = self._next(0.2)
            if event is None:
                raise SystemExit(f"orchestrator: dataflow closed while waiting for {what}")
            self._handle(event)

    def poll(self) -> None:
        deadline = time.monotonic() + self.delay
        while (left := deadline - time.monotonic()) > 0:
            event = self._next(left)
            if event is None:
                raise SystemExit("orchestrator: dataflow closed")
            self._handle(event)

    def control(self, command: str, wait: bool = True) -> None:
        self.control_id += 1
        cid = self.control_id
        self.node.send_output("control", pa.array([command]), {"control_id": cid})
        if wait:
            self.wait(lambda: any(a["metadata"].get("control_id") == cid for a in self.answers), command)

    def heard(self, keys: list[tuple[str, str]], sentences: list[str]) -> tuple[str, float]:
        """What the listener heard of an answer sent as ``sentences`` (one text each, ``keys``): the sentences
        spoken whole, then what the cut one reports (``spoken_text``, and of the sentence it cut, the part whose
        audio went out: ``cut_sent_text``); nothing after it. Returns (that text, the seconds of audio sent)."""
        heard, seconds = [], 0.0
        for key, sentence in zip(keys, sentences):
            if self.completes.get(key) == "completed":
                heard.append(sentence)
                continue
            md = self.reports.get(key, {})
            heard.append(str(md.get("spoken_text", "")) + str(md.get("cut_sent_text", "")))
            seconds = float(md.get("audio_sent_s", 0.0) or 0.0)
            break
        return "".join(h for h in heard if h.strip()).strip(), seconds

    def stream(self, question: str, answer: str, barge_in: bool = False) -> list[tuple[str, str]]:
        keys = []
        sentences = [s for s in answer.split("|") if s.strip()]
        for i, sentence in enumerate(sentences):
            md = {"session_id": "orchestrator", "question_id": question, "segment_index": str(i),
                  "session_status": "started" if i == 0 else "ongoing"}
            self.node.send_output("text", pa.array([sentence]), md)
            keys.append((question, str(i)))
            self.poll()
            if barge_in and question in self.first_audio:
                break
        if barge_in:
            self.wait(lambda: question in self.first_audio, f"first audio of question {question}")
            self.control("reset")
        self.wait(lambda: all(k in self.completes for k in keys), f"segment_complete of question {question}")
        # the LLM's history keeps what the listener heard, not what it meant to say
        heard, seconds = self.heard(keys, sentences)
        self.history.append({"role": "assistant", "content": heard})
        if barge_in:
            whole = sum(self.completes[k] == "completed" for k in keys)
            print(f"orchestrator: answer {question} was cut by the barge-in: the listener heard {whole} of "
                  f"{len(sentences)} sentence(s) whole ({seconds:.2f} s of audio of the cut one); history keeps "
                  f"{heard!r}", file=sys.stderr)
        return keys


def main() -> int:
    node = Node()
    orch = Orchestrator(node)
    try:
        return converse(orch)
    except TTSNotStarted:
        print(ended_line("orchestrator"), file=sys.stderr)
        return 0


def converse(orch: Orchestrator) -> int:
    """The scripted conversation:

    1. ``list_voices`` and ``stats``;
    2. answer 1 (``ANSWER_1``, sentences separated by ``|``) streamed on ``text`` every ``STREAM_DELAY``
       seconds; as soon as the first audio of it arrives it sends ``reset`` (the user barged in), so the
       rest of answer 1 is cancelled (each cancelled text still gets its ``segment_complete``, which reports what
       of it went out); the conversation history keeps what the listener heard of answer 1 (printed);
    3. ``change_voice:$VOICE_2`` (if set);
    4. answer 2 (``ANSWER_2``), streamed; it waits for every ``segment_complete``;
    5. ``stats``, then ``done``."""
    node = orch.node
    orch.control("list_voices")
    orch.control("stats")
    keys1 = orch.stream("1", os.environ.get("ANSWER_1", ANSWER_1), barge_in=True)
    voice2 = os.environ.get("VOICE_2", "").strip()
    if voice2:
        orch.control(f"change_voice:{voice2}")
    keys2 = orch.stream("2", os.environ.get("ANSWER_2", ANSWER_2))
    orch.control("stats")
    outcomes = [orch.completes[k] for k in keys1 + keys2]
    node.send_output("done", pa.array([True]), {"outcomes": json.dumps(outcomes),
                                                "history": json.dumps(orch.history, ensure_ascii=False)})
    print(f"orchestrator: done, outcomes {outcomes}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
