"""A dora node for tests/node/test_dora_metadata.py: sends texts whose metadata the node cannot echo as it came
(a ``segment_index`` beyond int64 as a string and as a float, a 10 000-character string, a 2 000-item list),
one after the other, and writes every ``segment_complete`` it receives (question_id, outcome, segment_index) to
``$OUT`` (JSON)."""

from __future__ import annotations

import json
import os

import pyarrow as pa
from dora import Node

CASES = {
    "index-1e308": {"segment_index": "1e308"},
    "index-2p63": {"segment_index": "9223372036854775808"},
    "index-1e19": {"segment_index": 1e19},
    "long-string": {"segment_index": 0, "note": "n" * 10_000},
    "long-list": {"segment_index": 1, "ids": list(range(2_000))},
}


def main() -> None:
    node = Node()
    answers: list[dict] = []
    ready = []

    def pump(until) -> None:
        while not until():
            event = node.next()
            if event is None or event["type"] == "STOP":
                raise SystemExit("metadata_sender: the dataflow stopped early")
            if event["type"] != "INPUT":
                continue
            md = event.get("metadata") or {}
            if event["id"] == "segment_complete":
                answers.append({"question_id": md.get("question_id"), "outcome": event["value"][0].as_py(),
                                "segment_index": md.get("segment_index"), "keys": sorted(md)})
            elif event["id"] == "status" and json.loads(event["value"][0].as_py()).get("status") == "ready":
                ready.append(True)

    pump(lambda: bool(ready))
    for qid, md in CASES.items():
        node.send_output("text", pa.array(["Hello."]), {"question_id": qid, **md})
        pump(lambda qid=qid: any(a["question_id"] == qid for a in answers))
    with open(os.environ["OUT"], "w", encoding="utf-8") as f:
        json.dump(answers, f)


if __name__ == "__main__":
    main()
