"""A hostile or careless token-stream sender for tests/node/test_dora_hostile.py (issue 50): in one ``dora run`` it
sends, each after the answers to the one before:

1. ``reference``: "Hello there." as a plain text (the audio the reasoning case must equal), and "Another session."
   from session ``other`` alone (its time to an answer: the calibration);
2. form 1: a ``<think>`` block opened in segment ``think``/1, a pause longer than ``PRIMESPEECH_SEGMENT_IDLE_S``,
   more reasoning, then ``</think>`` and "Hello there." with ``fin``;
3. form 3: segment ``neg``/1 as one fragment with ``seq: -1`` and ``fin``;
4. form 2: a barge-in (``control`` "" with ``flush: true``) whose ``timestamp`` is 2100-01-01, a plain text once
   it arrived (its ``flush`` status), and a fragment of a new segment (``late``/1) whose ``timestamp`` says it was
   sent 5 s before the barge-in;
5. form 5: 1 500 one-character "。" fragments of segment ``marks``/1 as fast as it can, then "Another session." from
   session ``other`` (its time to an answer, against the calibration);
6. form 4: one fragment of 1 MB (segment ``big``/1, ``fin``).

It writes what it saw to ``RESULT_FILE``: every ``segment_complete`` (value and metadata) and the two timings."""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time

import pyarrow as pa
from dora import Node

IDLE_S = float(os.environ.get("IDLE_S", "0.5"))


class Sender:
    def __init__(self, node: Node):
        self.node = node
        self.answers: list[dict] = []
        self.statuses: list[str] = []

    def pump(self, until, what: str) -> None:
        while not until():
            event = self.node.next()
            if event is None or event["type"] == "STOP":
                raise SystemExit(f"hostile_sender: the dataflow closed while waiting for {what}")
            if event["type"] == "INPUT" and event["id"] == "status":
                self.statuses.append(json.loads(event["value"][0].as_py()).get("status"))
            if event["type"] == "INPUT" and event["id"] == "segment_complete":
                md = {k: (v.timestamp() if isinstance(v, dt.datetime) else v)
                      for k, v in (event.get("metadata") or {}).items()}
                self.answers.append({"value": event["value"][0].as_py(), "metadata": md, "at": time.monotonic()})

    def answered(self, **keys) -> list[dict]:
        return [a for a in self.answers if all(a["metadata"].get(k) == v for k, v in keys.items())]

    def text(self, text: str, **md) -> float:
        self.node.send_output("text", pa.array([text]), md)
        return time.monotonic()

    def fragment(self, text: str, session: str, segment: int, seq, fin: bool = False, **md) -> None:
        meta = {"session_id": session, "segment_id": segment, "seq": seq, "question_id": f"{session}{segment}", **md}
        if fin:
            meta["fin"] = True
        self.node.send_output("text", pa.array([text]), meta)

    def timed(self, text: str, question: str) -> float:
        """Seconds from sending a plain text of session ``other`` to its answer."""
        sent = self.text(text, session_id="other", question_id=question)
        self.pump(lambda: self.answered(question_id=question), f"the answer to {question}")
        return self.answered(question_id=question)[0]["at"] - sent


def main() -> int:
    s = Sender(Node())
    s.text("Hello there.", question_id="whole")
    s.pump(lambda: s.answered(question_id="whole"), "the reference text")
    alone = min(s.timed("Another session.", f"alone{k}") for k in range(2))

    # form 1: reasoning open across the idle end of its utterance
    s.fragment("<think>\n让我想一想。", "think", 1, 0)
    time.sleep(IDLE_S * 3)
    s.fragment("我再想想二加二。", "think", 1, 1)
    s.fragment("</think>\nHello there.", "think", 1, 2, fin=True)
    s.pump(lambda: s.answered(session_id="think", segment_id=1, question_id="think1")
           and s.answered(session_id="think")[-1]["value"] == "completed", "the answer of the think segment")

    # form 3: a negative seq
    s.fragment("Negative.", "neg", 1, -1, fin=True)
    s.pump(lambda: s.answered(session_id="neg"), "the answer of seq -1")

    # form 2: a barge-in from the future, then a text, then a fragment sent (it says) before the barge-in
    future = dt.datetime(2100, 1, 1, tzinfo=dt.timezone.utc)
    s.node.send_output("control", pa.array([""]), {"flush": True, "timestamp": future})
    s.pump(lambda: "flush" in s.statuses, "the barge-in's status")  # (a text sent after it arrived)
    s.text("Still here.", question_id="after-future")
    s.pump(lambda: s.answered(question_id="after-future"), "the text after the barge-in from the future")
    past = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=5)
    s.fragment("Too late.", "late", 1, 0, fin=True, timestamp=past)
    s.pump(lambda: s.answered(session_id="late"), "the answer of the late fragment")

    # form 5: a run of end marks, fragment by fragment, and another session's text behind it
    for n in range(1500):
        s.fragment("。", "marks", 1, n, fin=n == 1499)
    during = s.timed("Another session.", "during")
    s.pump(lambda: s.answered(session_id="marks"), "the answer of the run of end marks")

    # form 4: a fragment of 1 MB
    s.fragment("好" * 1_000_000, "big", 1, 0, fin=True)
    s.pump(lambda: s.answered(session_id="big"), "the answer of the 1 MB fragment")

    with open(os.environ["RESULT_FILE"], "w", encoding="utf-8") as f:
        json.dump({"answers": s.answers, "alone": alone, "during": during}, f, ensure_ascii=False)
    print(f"hostile_sender: {len(s.answers)} answers; another session's text alone {alone:.2f} s, behind the run "
          f"of end marks {during:.2f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
