"""Demo/test text source for dora-primespeech-mlx, behaving like dora-text-segmenter.

It sends one ``text`` at a time with session metadata (``session_id``, ``question_id`` as str,
``segment_index``, ``session_status``) and waits for the TTS node's ``segment_complete`` before the next
one; after each question it sends the segmenter's flush (empty text, ``session_status: "ended"``). Then
it sends ``done`` and stops. The script's syntax is in :func:`load_script`.

Other env: ``SESSION_ID`` (default "demo"), ``SEGMENT_INDEX_AS_STR`` ("true": send "0" like the MaaS
client), ``SEND_FLUSH`` (default true).

When the TTS node reports on ``status`` that it cannot start, the source ends with one line (exit code 0): the
TTS node's own message says what is wrong. Console script: ``primespeech-demo-text-source``."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pyarrow as pa
from dora import Node

from dora_primespeech_mlx.demo.tts_status import TTSNotStarted, ended_line, start_failure

DEMO = Path(__file__).with_name("script.txt")  # the built-in script (package data)

def _truthy(name: str, default: str) -> bool:
    return os.environ.get(name, default).strip().lower() in {"1", "true", "yes", "on"}


def load_script() -> list[str]:
    """The script's lines: env ``SCRIPT_FILE``, else ``SCRIPT`` with lines separated by ``\\n``, else the built-in demo
    ``script.txt`` beside this file. One item per line:

    - ``text``             send on ``text`` and wait for its segment_complete (JSON payloads and ``VOICE:``
                           prefixes are sent as they are);
    - ``& text``           send without waiting (the answer is awaited before ``done``);
    - ``!command``         send on ``control`` (``!stats``, ``!change_voice:Maple``, ``!reset``) and wait for
                           the ``status`` answer that echoes its ``control_id``;
    - ``@sleep SECONDS``   pause; ``@wait STATUS`` waits for a ``status`` message with that status
                           (e.g. ``@wait synthesizing``; ``@wait audio`` waits for the next ``audio``
                           message, if that input is wired); ``@raw HEX`` sends raw bytes on ``text``;
    - empty line           next question (new ``question_id``); ``#`` starts a comment line."""
    path = os.environ.get("SCRIPT_FILE", "").strip()
    if path:
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    text = os.environ.get("SCRIPT")
    return (text if text is not None else DEMO.read_text(encoding="utf-8")).splitlines()


class Source:
    def __init__(self, node: Node):
        self.node = node
        self.index_as_str = _truthy("SEGMENT_INDEX_AS_STR", "false")
        self.session = os.environ.get("SESSION_ID", "demo")
        self.outstanding: set[tuple[str, str]] = set()  # (question_id, segment_index) sent, not answered
        self.statuses: list[dict] = []
        self.question = 1
        self.segment = 0
        self.control_id = 0
        self.closed = False
        self.audio_count = 0

    # -- receiving ---------------------------------------------------------------------------------
    def _pump(self, until, what: str) -> None:
        # Blocking next(): dora-rs 1.1's next(timeout) can lose an event now and then.
        while not until():
            if self.closed:
                raise SystemExit(f"text_source: the dataflow closed while waiting for {what}")
            event = self.node.next()
            if event is None:  # the event stream ended: nothing more will come
                self.closed = True
                continue
            if event["type"] != "INPUT":  # (after a STOP the inputs already sent still come, e.g. the TTS node's
                continue                  # start failure and its answers when it failed: read them to the end)
            md = event.get("metadata") or {}
            if event["id"] == "segment_complete":
                key = (str(md.get("question_id")), str(md.get("segment_index")))
                self.outstanding.discard(key)
            elif event["id"] == "audio":
                self.audio_count += 1
            elif event["id"] == "status":
                try:
                    self.statuses.append({"body": json.loads(event["value"][0].as_py()), "metadata": md})
                except (ValueError, IndexError, TypeError):
                    continue
                failure = start_failure(self.statuses[-1]["body"])
                if failure is not None:
                    raise TTSNotStarted(failure)

    # -- sending -----------------------------------------------------------------------------------
    def _metadata(self, status: str | None = None) -> dict:
        index = self.segment
        md = {
            "session_id": self.session,
            "question_id": str(self.question),
            "segment_index": str(index) if self.index_as_str else index,
            "session_status": status or ("started" if index == 0 else "ongoing"),
        }
        self.segment += 1
        return md

    def send_text(self, data, wait: bool, status: str | None = None) -> None:
        md = self._metadata(status)
        key = (md["question_id"], str(md["segment_index"]))
        self.outstanding.add(key)
        array = data if isinstance(data, (bytes, pa.Array)) else pa.array([data])
        self.node.send_output("text", array, md)
        if wait:
            self._pump(lambda: key not in self.outstanding, f"segment_complete of {key}")

    def send_control(self, command: str) -> None:
        self.control_id += 1
        cid = self.control_id
        self.node.send_output("control", pa.array([command]), {"control_id": cid, "question_id": str(self.question)})
        self._pump(lambda: any(s["metadata"].get("control_id") == cid for s in self.statuses),
                   f"the status answer to {command!r}")

    def wait_for(self, wanted: str) -> None:
        """Wait for the next ``audio`` message (``audio``) or ``status`` message with that status."""
        if wanted == "audio":
            seen = self.audio_count
            self._pump(lambda: self.audio_count > seen, "audio")
            return
        seen = len(self.statuses)
        self._pump(lambda: any(s["body"].get("status") == wanted for s in self.statuses[seen:]),
                   f"status {wanted!r}")

    def end_question(self) -> None:
        if self.segment and _truthy("SEND_FLUSH", "true"):
            self.send_text("", wait=True, status="ended")
        self.question += 1
        self.segment = 0

    def run(self, lines: list[str]) -> None:
        for line in lines:
            if line.startswith("#"):
                continue
            if not line.strip():
                if self.segment:
                    self.end_question()
                continue
            if line.startswith("!"):
                self.send_control(line[1:].strip())
            elif line.startswith("@sleep"):
                time.sleep(float(line.split()[1]))
            elif line.startswith("@wait"):
                self.wait_for(line.split(maxsplit=1)[1].strip())
            elif line.startswith("@raw"):
                self.send_text(bytes.fromhex(line.split(maxsplit=1)[1]), wait=True)
            elif line.startswith("& "):
                self.send_text(line[2:], wait=False)
            else:
                self.send_text(line, wait=True)
        if self.segment:
            self.end_question()
        self._pump(lambda: not self.outstanding, f"segment_complete of {sorted(self.outstanding)}")
        self.node.send_output("done", pa.array([True]), {"questions": self.question - 1})


def main() -> int:
    node = Node()
    source = Source(node)
    try:
        source.run(load_script())
    except TTSNotStarted:
        print(ended_line("text_source"), file=sys.stderr)
        return 0
    print(f"text_source: done ({source.question - 1} question(s))", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
