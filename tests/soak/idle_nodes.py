"""Two plain dora nodes for tests/soak/idle_probe.py (no TTS): ``ROLE=src`` sends ``COUNT`` pings with
``SILENCE`` seconds of silence before each later one and waits for each ack; ``ROLE=echo`` acks every
ping. The source appends one JSON line per event to ``$RESULT`` (what it sent, what came back, and how
the flow ended)."""

from __future__ import annotations

import json
import os
import sys
import time

import pyarrow as pa
from dora import Node


def _record(**entry) -> None:
    with open(os.environ["RESULT"], "a", encoding="utf-8") as f:
        f.write(json.dumps({"t": round(time.time(), 1), **entry}) + "\n")


def source(node: Node) -> int:
    count = int(os.environ.get("COUNT", "2"))
    silence = float(os.environ.get("SILENCE", "150"))
    for i in range(count):
        if i:
            time.sleep(silence)
        try:
            node.send_output("ping", pa.array([i]))
        except Exception as exc:  # the daemon has gone: the flow was stopped during the silence
            _record(event="send_failed", ping=i, error=str(exc))
            return 2
        _record(event="sent", ping=i)
        while True:
            event = node.next()
            if event is None or event["type"] == "STOP":
                _record(event="stopped", ping=i, kind=None if event is None else event.get("id"))
                return 3
            if event["type"] == "INPUT" and event["id"] == "ack":
                _record(event="acked", ping=i)
                break
    _record(event="done")
    return 0


def echo(node: Node) -> int:
    for event in node:
        if event["type"] == "INPUT" and event["id"] == "ping":
            node.send_output("ack", event["value"])
        elif event["type"] == "STOP" or (event["type"] == "INPUT_CLOSED" and event["id"] == "ping"):
            break  # (a timer input would otherwise keep this node waiting)
    return 0


if __name__ == "__main__":
    role = os.environ["ROLE"]
    sys.exit(source(Node()) if role == "src" else echo(Node()))
