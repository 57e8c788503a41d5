"""A stand-in for the ``dora`` Python API, for running ``dora_primespeech_mlx.node.main`` in a subprocess without a
dataflow (tests/node/test_sigterm.py puts this folder first on PYTHONPATH).

``Node.next()`` hands out the events listed as JSON in ``FAKE_DORA_EVENTS`` (``{"id", "value", "metadata"}``, each
an INPUT with a one-string array), then blocks as dora does while no event comes (``next(timeout)``: a "timed
out" ERROR event after the timeout). ``send_output`` appends one JSON line per output to ``FAKE_DORA_OUT``
(id, values, metadata), and raises like dora for metadata it cannot send (an int outside int64)."""

from __future__ import annotations

import json
import os
import threading
import time

import pyarrow as pa


class DoraStatus:
    CONTINUE, STOP = 0, 1


class Node:
    def __init__(self):
        self._events = [{"type": "INPUT", "id": e["id"], "value": pa.array([e["value"]]),
                         "metadata": e.get("metadata", {})} for e in json.loads(os.environ["FAKE_DORA_EVENTS"])]
        self._out = open(os.environ["FAKE_DORA_OUT"], "a", encoding="utf-8")  # noqa: SIM115 - lives with the node
        self._lock = threading.Lock()

    def next(self, timeout: float | None = None):
        if self._events:
            return self._events.pop(0)
        if timeout is not None:
            time.sleep(timeout)
            return {"type": "ERROR", "error": "timed out"}
        threading.Event().wait()  # no more events: dora blocks until the dataflow stops
        return None

    def send_output(self, output_id: str, data: pa.Array, metadata: dict | None = None) -> None:
        for value in (metadata or {}).values():
            if isinstance(value, int) and not -(2**63) <= value < 2**63:
                raise OverflowError("int too big to convert")
        line = json.dumps({"id": output_id, "values": data.to_pylist()[:1] if output_id != "audio" else len(data),
                           "metadata": metadata or {}}, default=str)
        with self._lock:
            self._out.write(line + "\n")
            self._out.flush()
