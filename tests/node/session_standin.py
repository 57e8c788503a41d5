"""A conversation stand-in for tests/node/test_dora_sessions.py: two sessions on one TTS node.

Plan (JSON file in ``PLAN_FILE``):

- ``texts``: ``[{"voice", "lang", "text"}]``; for each, a ``change_voice`` to its voice, then the text streamed as
  an utterance of session ``spans`` (fragments of 2-5 characters with ``segment_id``/``seq``/``fin``) and sent
  whole as a plain text (JSON, with its language), each awaited;
- ``room2``: plain texts of session ``room2`` spoken with ``VOICE:<room2_voice>|``; the first before session
  ``room1``'s answer, the others while it streams;
- ``room1``: an answer of session ``room1`` (segment 1): two thirds of it streamed at 30 fragments per second;
  once the node synthesises its second sentence the stand-in sends ``control`` ``cancel`` with
  ``session_id: room1``, then the rest of it (dropped by the node: its utterance was cancelled) and the other
  texts of ``room2``;
- then ``stats``, and ``done`` once every answer and the stats are in.
"""

from __future__ import annotations

import json
import os
import sys
import time

import llm_standin  # (beside this script: its directory is on sys.path)
import pyarrow as pa
from dora import Node

RATE = 30.0  # fragments per second


class Standin(llm_standin.Standin):
    name = "session_standin"

    def __init__(self, node: Node):
        super().__init__(node, key=key, seed=11)

    def fragment(self, session: str, segment: int, n: int, part: str, last: bool) -> None:
        md = {"session_id": session, "segment_id": segment, "seq": n}
        if last:
            md["fin"] = True
        self.node.send_output("text", pa.array([part]), md)

    def status(self, name: str) -> bool:
        return any(body.get("status") == name for body, _ in self.statuses)


def key(md: dict) -> str:
    return f"{md.get('session_id')}/{md['segment_id'] if 'segment_id' in md else md.get('question_id')}"


def main() -> int:
    with open(os.environ["PLAN_FILE"], encoding="utf-8") as f:
        plan = json.load(f)
    node = Node()
    s = Standin(node)
    for k, case in enumerate(plan["texts"]):
        node.send_output("control", pa.array([f"change_voice:{case['voice']}"]), {})
        for n, part in enumerate(parts := s.fragments(case["text"])):
            s.fragment("spans", k, n, part, n == len(parts) - 1)
        s.pump(lambda k=k: f"spans/{k}" in s.answered, f"utterance {k}")
        node.send_output("text", pa.array([json.dumps({"prompt": case["text"], "language": case["lang"]})]),
                         {"session_id": "spans", "question_id": f"plain{k}"})
        s.pump(lambda k=k: f"spans/plain{k}" in s.answered, f"plain text {k}")
    node.send_output("control", pa.array([f"change_voice:{plan['room1_voice']}"]), {})

    def room2(n: int) -> None:
        node.send_output("text", pa.array([f"VOICE:{plan['room2_voice']}|{plan['room2'][n]}"]),
                         {"session_id": "room2", "question_id": f"r2-{n}"})

    room2(0)
    parts = s.fragments(plan["room1"])
    head = len(parts) * 2 // 3
    for n, part in enumerate(parts[:head]):
        s.fragment("room1", 1, n, part, False)
        time.sleep(1.0 / RATE)
        if n == 5:
            room2(1)
    s.pump(lambda: any(b.get("status") == "synthesizing" and m.get("session_id") == "room1"
                       and b.get("sentence", 0) >= 1 for b, m in s.statuses), "room1's second sentence")
    node.send_output("control", pa.array(["cancel"]), {"session_id": "room1"})
    for n, part in enumerate(parts[head:], head):  # dropped by the node: their utterance was cancelled
        s.fragment("room1", 1, n, part, n == len(parts) - 1)
    for n in range(2, len(plan["room2"])):
        room2(n)
    wanted = ["room1/1", *[f"room2/r2-{n}" for n in range(len(plan["room2"]))]]
    s.pump(lambda: all(w in s.answered for w in wanted) and s.status("cancel"), "the answers of both sessions")
    node.send_output("control", pa.array(["stats"]), {})
    s.pump(lambda: s.status("stats"), "the stats")
    node.send_output("done", pa.array([True]), {})
    print(f"session_standin: answers {s.answered}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
