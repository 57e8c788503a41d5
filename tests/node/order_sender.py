"""A dora node for tests/node/test_dora_order.py: per round it sends a long text, a burst of ``stats`` controls and
a ``reset`` on ``control`` (so the controls queue up behind each other), then a text sent after the reset, and
waits for that text's answer. Every segment_complete and status it receives is written to ``$OUT`` (JSON)."""

from __future__ import annotations

import json
import os

import pyarrow as pa
from dora import Node

LONG = "One small test of order. Two small tests of order. Three small tests of order. Four small tests."


def main() -> None:
    node = Node()
    rounds, burst = int(os.environ.get("ROUNDS", "3")), int(os.environ.get("BURST", "300"))
    answers: dict[str, str] = {}
    statuses: list[dict] = []

    def pump(until) -> None:
        while not until():
            event = node.next()
            if event is None or event["type"] == "STOP":
                raise SystemExit("order_sender: the dataflow stopped early")
            if event["type"] != "INPUT":
                continue
            md = event.get("metadata") or {}
            if event["id"] == "segment_complete":
                outcome = event["value"][0].as_py()
                answers[str(md.get("question_id"))] = md.get("error", outcome) if outcome == "error" else outcome
            elif event["id"] == "status":
                statuses.append(json.loads(event["value"][0].as_py()))

    pump(lambda: any(s.get("status") == "ready" for s in statuses))
    for i in range(rounds):
        node.send_output("text", pa.array([LONG]), {"question_id": f"before-{i}", "segment_index": 0})
        for _ in range(burst):
            node.send_output("control", pa.array(["stats"]), {})
        node.send_output("control", pa.array(["reset"]), {"round": i})
        node.send_output("text", pa.array([LONG]), {"question_id": f"after-{i}", "segment_index": 0})
        pump(lambda i=i: f"after-{i}" in answers and f"before-{i}" in answers)
    with open(os.environ["OUT"], "w", encoding="utf-8") as f:
        json.dump({"answers": answers, "statuses": [s for s in statuses if s.get("status") != "stats"]}, f)


if __name__ == "__main__":
    main()
