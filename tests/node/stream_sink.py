"""A recorder for tests/node/test_dora_stream.py: every event it receives, in arrival order, with its metadata
(dora's send ``timestamp`` as seconds since the epoch) and its value (audio samples saved as ``audio-N.npy``);
``OUTPUT_DIR/report.json`` is written when the inputs close."""

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


def plain(md: dict) -> dict:
    out = {}
    for k, v in md.items():
        if isinstance(v, dt.datetime):
            v = v.timestamp()
        out[k] = v if isinstance(v, (str, int, float, bool, type(None))) else str(v)
    return out


def main() -> int:
    out = Path(os.environ.get("OUTPUT_DIR", "out"))
    out.mkdir(parents=True, exist_ok=True)
    events = []
    node = Node()
    while True:
        event = node.next()
        if event is None or event["type"] == "STOP":
            break
        if event["type"] != "INPUT":
            continue
        value = event["value"]
        record = {"input": event["id"], "arrival": time.time(), "metadata": plain(event.get("metadata") or {})}
        if event["id"] == "audio":
            samples = value.to_numpy(zero_copy_only=False) if not pa.types.is_list(value.type) else \
                np.asarray(value[0].as_py(), dtype=np.float32)
            record["file"] = f"audio-{len(events)}.npy"
            np.save(out / record["file"], np.asarray(samples, dtype=np.float32))
        else:
            try:
                record["value"] = value[0].as_py()
            except (IndexError, TypeError):
                record["value"] = None
        events.append(record)
    (out / "report.json").write_text(json.dumps(events, ensure_ascii=False, indent=1), encoding="utf-8")
    print(f"stream_sink: {len(events)} event(s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
