"""Listener node for the distributed example, its test and bench_wire.py: records what arrives from the TTS.

Inputs (all optional): ``audio``, ``segment_complete``, ``status`` of the TTS node. For every message it
records the arrival wall-clock time and ``age``: arrival minus ``metadata["timestamp"]``. Note what that
stamp is here: the TTS node passes the incoming text's metadata through, and dora's Python API lets a
``timestamp`` parameter overwrite its own send stamp, so it is the time the *text* was sent (by a node on
the same host clock on loopback) and ``age`` is "time since the text was sent". For ``audio`` it also keeps
the float32 samples exactly as received.

While running it appends one JSON line per input to ``$OUTPUT_DIR/events.jsonl`` (flushed, so a test can
watch progress; every instance appends, e.g. after ``dora restart``, and each line carries the probe's
``pid``); at the end it writes ``$OUTPUT_DIR/probe.json`` (every event's metadata and times) and
``$OUTPUT_DIR/audio.npz`` (one float32 array per audio message, keyed ``<question_id>/<segment_index>/<n>``).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from dora import Node


def samples(value: pa.Array) -> np.ndarray:
    """Float samples of an ``audio`` value: ``pa.array([samples])`` (ListArray) or a flat array."""
    if pa.types.is_list(value.type) or pa.types.is_large_list(value.type):
        value = value.flatten()
    return value.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)


def sent_at(md: dict) -> float | None:
    stamp = md.get("timestamp")
    if isinstance(stamp, dt.datetime):
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=dt.timezone.utc)
        return stamp.timestamp()
    return None


def plain(value):
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)


def main() -> int:
    node = Node()
    out = Path(os.environ.get("OUTPUT_DIR", "out/probe"))
    out.mkdir(parents=True, exist_ok=True)
    events: list[dict] = []
    arrays: dict[str, np.ndarray] = {}
    counts: dict[tuple, int] = {}
    pid = os.getpid()
    with open(out / "events.jsonl", "a", encoding="utf-8") as progress:
        while True:
            event = node.next()
            if event is None or event["type"] == "STOP":
                break
            if event["type"] != "INPUT":
                entry = {"input": None, "type": event["type"], "arrived": time.time(), "pid": pid}
            else:
                md = event.get("metadata") or {}
                arrived = time.time()
                stamp = sent_at(md)
                entry = {"input": event["id"], "arrived": arrived, "stamp": stamp, "pid": pid,
                         "age": None if stamp is None else arrived - stamp,
                         "question_id": str(md.get("question_id")), "segment_index": str(md.get("segment_index")),
                         "metadata": plain({k: v for k, v in md.items() if k != "timestamp"})}
                if event["id"] == "audio":
                    data = samples(event["value"])
                    key = (entry["question_id"], entry["segment_index"])
                    n = counts.get(key, 0)
                    counts[key] = n + 1
                    arrays[f"{key[0]}/{key[1]}/{n}"] = data
                    entry["samples"] = int(data.size)
                else:
                    try:
                        text = event["value"][0].as_py()
                        entry["value"] = json.loads(text) if event["id"] == "status" else text
                    except (ValueError, IndexError, TypeError):
                        entry["value"] = None
            events.append(entry)
            progress.write(json.dumps(entry, ensure_ascii=False, default=str) + "\n")
            progress.flush()
    np.savez(out / "audio.npz", **arrays)
    (out / "probe.json").write_text(json.dumps({"events": events}, ensure_ascii=False, default=str),
                                    encoding="utf-8")
    print(f"audio_probe: {len(events)} events, {len(arrays)} audio messages -> {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
