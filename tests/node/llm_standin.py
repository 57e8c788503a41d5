"""An LLM stand-in for tests/node/test_dora_stream.py: streams answers to the TTS node as ``text`` fragments of
2-5 characters at 30 fragments per second, with dora's streaming metadata (``session_id``, ``segment_id``,
``seq``, ``fin``), and barges in with ``flush: true``.

Plan (JSON file in ``PLAN_FILE``): ``answer`` (streamed as segment 1, then awaited), ``sentences`` (each sent
whole as a plain text, the reference audio), ``interrupted`` (streamed as segment 2 until the TTS reports that
it synthesises its second sentence), ``barge_in`` (segment 3, its first fragment with ``flush: true``).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

import pyarrow as pa
from dora import Node

RATE = 30.0  # fragments per second
SESSION = "chat"


def answer_key(md: dict) -> str:
    """segment_id, or question_id for a plain text."""
    return str(md["segment_id"]) if "segment_id" in md else str(md.get("question_id"))


class Standin:
    """Pumps the node's answers (``answered``: :func:`answer_key` -> outcome) and statuses; also the base of the
    other stand-ins (``key``: how an answer is named, ``seed``: how texts are cut into fragments)."""

    name = "llm_standin"

    def __init__(self, node: Node, key=answer_key, seed: int = 7):
        self.node = node
        self.answered: dict[str, str] = {}
        self.statuses: list[tuple[dict, dict]] = []
        self.rng = random.Random(seed)
        self._key = key

    def pump(self, until, what: str) -> None:
        while not until():
            event = self.node.next()  # blocking: dora-rs 1.1's next(timeout) can lose an event now and then
            if event is None or event["type"] == "STOP":
                raise SystemExit(f"{self.name}: the dataflow closed while waiting for {what}")
            if event["type"] != "INPUT":
                continue
            md = event.get("metadata") or {}
            if event["id"] == "segment_complete":
                self.answered[self._key(md)] = event["value"][0].as_py()
            elif event["id"] == "status":
                self.statuses.append((json.loads(event["value"][0].as_py()), md))

    def fragments(self, text: str) -> list[str]:
        out, i = [], 0
        while i < len(text):
            k = self.rng.randint(2, 5)
            out.append(text[i:i + k])
            i += k
        return out

    def stream(self, text: str, segment: int, flush: bool = False, share: float = 1.0) -> None:
        """Stream ``text`` as segment ``segment`` (only the first ``share`` of its fragments: no ``fin`` then)."""
        parts = self.fragments(text)
        for n, part in enumerate(parts[: round(len(parts) * share)]):
            md = {"session_id": SESSION, "segment_id": segment, "seq": n, "question_id": f"answer{segment}"}
            if n == len(parts) - 1:
                md["fin"] = True
            if flush and n == 0:
                md["flush"] = True
            self.node.send_output("text", pa.array([part]), md)
            time.sleep(1.0 / RATE)

    def synthesizing(self, segment: int, sentence: int) -> bool:
        return any(body.get("status") == "synthesizing" and md.get("segment_id") == segment
                   and body.get("sentence", -1) >= sentence for body, md in self.statuses)


def main() -> int:
    with open(os.environ["PLAN_FILE"], encoding="utf-8") as f:
        plan = json.load(f)
    node = Node()
    s = Standin(node)
    s.stream(plan["answer"], 1)
    s.pump(lambda: "1" in s.answered, "the answer of segment 1")
    for k, sentence in enumerate(plan["sentences"]):
        node.send_output("text", pa.array([sentence]), {"question_id": f"whole{k}"})
        s.pump(lambda k=k: f"whole{k}" in s.answered, f"the answer to sentence {k}")
    s.stream(plan["interrupted"], 2, share=0.5)
    s.pump(lambda: s.synthesizing(2, 1), "the second sentence of segment 2")
    s.stream(plan["barge_in"], 3, flush=True)
    s.pump(lambda: "2" in s.answered and "3" in s.answered, "the answers of segments 2 and 3")
    node.send_output("done", pa.array([True]), {})
    print(f"llm_standin: answers {s.answered}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
