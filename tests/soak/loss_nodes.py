"""Plain dora nodes for tests/soak/loss_repro.py (no TTS). ``ROLE`` picks one:

- ``src``: (with ``WAIT_READY=1`` first waits for a 'status' "ready" of a real TTS node, then writes
  ``$RESULT_DIR/started``) sends ``TEXTS`` small 'text' messages, all at once (``BURST=1``) or one at a
  time waiting for each ``segment_complete`` (``BURST=0``); it counts the ``segment_complete``s it
  receives. After the last text it waits until all are answered; a watchdog thread (no dora calls)
  ends it when nothing came for ``SETTLE`` seconds, so a lost answer does not hang it.
  All its dora calls are on the main thread.
- ``tts``: a stand-in for the TTS node. For every text it sends ``CHUNKS`` 'audio' messages of
  ``pa.array([float32 samples])`` (``CHUNK_S`` seconds at 32 kHz, like the node's streaming chunks), one
  'log' and one 'status' (small JSON strings) and one 'segment_complete'. ``SENDER=main``: sent from the
  event loop, between ``next()`` calls; ``SENDER=worker``: sent by a worker thread while the main thread
  waits in ``next()`` (how the node form sends on dora-rs 1.x).
- ``sink``: counts what arrives on each input (optionally ``DELAY_S`` per audio message, a slow consumer).

Each node writes its counters to ``$RESULT_DIR/<role>.json`` when it ends.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
from dora import Node

RATE = 32000


def _write(role: str, data: dict) -> None:
    path = Path(os.environ["RESULT_DIR"]) / f"{role}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)


def src(node: Node) -> int:
    texts = int(os.environ.get("TEXTS", "1000"))
    burst = os.environ.get("BURST", "1") == "1"
    settle = float(os.environ.get("SETTLE", "20"))
    answered: list[int] = []
    last = [time.monotonic()]
    t0 = time.monotonic()

    def finish() -> None:
        got = list(answered)
        _write("src", {"texts": texts, "answered": len(got), "unique": len(set(got)),
                       "in_order": got == sorted(got), "seconds": round(time.monotonic() - t0, 1),
                       "missing": sorted(set(range(texts)) - set(got))[:50]})
        os._exit(0)  # dora closes our outputs; the other nodes finish

    def watchdog() -> None:  # only reads the counters: every dora call stays on the main thread
        while True:
            time.sleep(0.5)
            if time.monotonic() - last[0] > settle:
                finish()

    if os.environ.get("WAIT_READY") == "1":  # a real TTS node: wait for its "ready" status (models loaded)
        while True:
            event = node.next()
            if event is None or event["type"] == "STOP":
                finish()
            if event["type"] == "INPUT" and event["id"] == "status" and '"ready"' in str(event["value"][0]):
                break
        Path(os.environ["RESULT_DIR"], "started").write_text(str(time.time()), encoding="utf-8")
    t0 = time.monotonic()
    last[0] = t0
    threading.Thread(target=watchdog, daemon=True).start()

    def wait_for(n: int) -> None:
        while len(answered) < n:
            event = node.next()
            if event is None or event["type"] == "STOP":
                finish()
            if event["type"] == "INPUT" and event["id"] == "segment_complete":
                answered.append(int(event["metadata"].get("text_id", -1)))
                last[0] = time.monotonic()

    for i in range(texts):
        node.send_output("text", pa.array([f"text {i}"]), {"text_id": i})
        last[0] = time.monotonic()
        if not burst:
            wait_for(i + 1)
    wait_for(texts)
    finish()
    return 0


def tts(node: Node) -> int:
    chunks = int(os.environ.get("CHUNKS", "3"))
    chunk = np.zeros(int(RATE * float(os.environ.get("CHUNK_S", "0.3"))), np.float32)
    worker_mode = os.environ.get("SENDER", "worker") == "worker"
    sent: Counter = Counter()

    def answer(md: dict) -> None:
        tid = md.get("text_id", -1)
        for c in range(chunks):
            node.send_output("audio", pa.array([chunk]), {"text_id": tid, "chunk": c, "sample_rate": RATE})
            sent["audio"] += 1
        node.send_output("log", pa.array([json.dumps({"level": "INFO", "message": f"done {tid}"})]), {})
        sent["log"] += 1
        node.send_output("status", pa.array([json.dumps({"status": "done", "text_id": tid})]), {"text_id": tid})
        sent["status"] += 1
        node.send_output("segment_complete", pa.array(["completed"]), {"text_id": tid})
        sent["segment_complete"] += 1

    jobs: queue.Queue = queue.Queue()

    def worker():
        while (md := jobs.get()) is not None:
            answer(md)

    thread = threading.Thread(target=worker, daemon=True)
    if worker_mode:
        thread.start()
    received = 0
    ids: list[int] = []
    while True:
        event = node.next()
        if event is None or event["type"] == "STOP":
            break
        if event["type"] == "INPUT" and event["id"] == "text":
            received += 1
            ids.append(int(event["metadata"].get("text_id", -1)))
            if worker_mode:
                jobs.put(dict(event["metadata"]))
            else:
                answer(event["metadata"])
    if worker_mode:
        jobs.put(None)
        thread.join()
    missing = sorted(set(range(max(ids, default=-1) + 1)) - set(ids))
    _write("tts", {"texts_received": received, "sent": dict(sent), "texts_missing": missing[:100],
                   "texts_in_order": ids == sorted(ids)})
    return 0


def sink(node: Node) -> int:
    delay = float(os.environ.get("DELAY_S", "0"))
    got: Counter = Counter()
    ids: list[int] = []
    while True:
        event = node.next()
        if event is None or event["type"] == "STOP":
            break
        if event["type"] == "INPUT":
            got[event["id"]] += 1
            if event["id"] == "segment_complete":
                ids.append(int(event["metadata"].get("text_id", -1)))
            elif event["id"] == "audio" and delay:
                time.sleep(delay)
    _write(os.environ.get("NAME", "sink"), {"received": dict(got), "unique_answers": len(set(ids)),
                                            "in_order": ids == sorted(ids)})
    return 0


if __name__ == "__main__":
    role = os.environ["ROLE"]
    sys.exit({"src": src, "tts": tts, "sink": sink}[role](Node()))
