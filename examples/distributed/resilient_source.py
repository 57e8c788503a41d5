"""A text source that survives the TTS machine going away (the consumer guidance of README "Across machines").

Like nodes/text_source.py it sends one ``text`` at a time (session metadata: ``session_id``, ``question_id``
as str, ``segment_index``, ``session_status``) and waits for its ``segment_complete``. A text that was in
flight when the TTS node died gets no answer, ever: dora does not replay it to the restarted node. The
restarted node announces itself with ``status`` ``{"status": "ready"}``; when such a ``ready`` arrives while
a text is outstanding, this source records the text as lost and sends it again (``RESEND=false``: skips it).

Env: ``SCRIPT_FILE`` (one text per line, an empty line starts the next question), ``OUTPUT_DIR`` (writes
``source-<pid>.json``: every text sent, its answer, the losses and the time from the loss to the next answer),
``SESSION_ID`` (default "demo"), ``RESEND`` (default true).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pyarrow as pa
from dora import Node


def main() -> int:
    node = Node()
    out = Path(os.environ.get("OUTPUT_DIR", "out/source"))
    out.mkdir(parents=True, exist_ok=True)
    resend = os.environ.get("RESEND", "true").strip().lower() in {"1", "true", "yes", "on"}
    session = os.environ.get("SESSION_ID", "demo")
    with open(os.environ["SCRIPT_FILE"], encoding="utf-8") as f:
        lines = f.read().splitlines()
    sent: list[dict] = []
    lost: list[dict] = []
    readies: list[float] = []
    question, segment = 1, 0
    closed = False

    def save() -> None:  # after every answer: a source killed by `dora stop`/`restart` leaves its record
        path = out / f"source-{os.getpid()}.json"  # written whole or not at all (a kill mid-write left it empty)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(
            {"pid": os.getpid(), "sent": sent, "lost": lost, "ready": readies, "closed": closed},
            ensure_ascii=False, indent=1), encoding="utf-8")
        os.replace(tmp, path)

    def send(text: str, md: dict) -> dict:
        node.send_output("text", pa.array([text]), md)
        entry = {"text": text, "question_id": md["question_id"], "segment_index": md["segment_index"],
                 "sent": time.time(), "outcome": None, "answered": None}
        sent.append(entry)
        return entry

    def wait_answer(text: str, md: dict) -> None:
        nonlocal closed
        entry = send(text, md)
        while entry["outcome"] is None and not closed:
            event = node.next()
            if event is None or event["type"] == "STOP":
                closed = True
                break
            if event["type"] != "INPUT":
                continue
            emd = event.get("metadata") or {}
            if event["id"] == "segment_complete":
                if (str(emd.get("question_id")), str(emd.get("segment_index"))) == (
                        entry["question_id"], str(entry["segment_index"])):
                    entry["outcome"] = event["value"][0].as_py()
                    entry["answered"] = time.time()
                    save()
            elif event["id"] == "status":
                try:
                    status = json.loads(event["value"][0].as_py()).get("status")
                except (ValueError, IndexError, TypeError, AttributeError):
                    status = None
                if status != "ready":
                    continue
                readies.append(time.time())
                if len(readies) > 1:  # the node came back: the text in flight is gone
                    entry["outcome"] = "lost"
                    lost.append({"text": text, "question_id": entry["question_id"],
                                 "segment_index": entry["segment_index"], "sent": entry["sent"],
                                 "ready_again": readies[-1], "resent": resend})
                    print(f"resilient_source: TTS restarted, text {entry['question_id']}/"
                          f"{entry['segment_index']} lost{'; sending it again' if resend else ''}", file=sys.stderr)
                    save()
                    if resend:
                        entry = send(text, md)

    for line in [*lines, ""]:
        if closed:
            break
        if not line.strip():
            if segment:
                wait_answer("", {"session_id": session, "question_id": str(question), "segment_index": segment,
                                 "session_status": "ended"})
                question, segment = question + 1, 0
            continue
        wait_answer(line, {"session_id": session, "question_id": str(question), "segment_index": segment,
                           "session_status": "started" if segment == 0 else "ongoing"})
        segment += 1
    save()
    print(f"resilient_source: {len(sent)} text(s) sent, {len(lost)} lost", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
