"""How outputs reach dora, behind one interface (``send(output_id, array, metadata)``), so the handler never
touches the dora API. Only the subset shared by dora-rs 0.3.x and 1.x is used (``send_output(id, pa.Array,
dict)``).

- :class:`DirectTransport` calls a send function at once (dora-rs 1.x node form: the worker may send while the
  main thread waits in ``next()``; tests pass a recorder);
- :class:`OutboxTransport` queues outputs for a thread that owns the sender and drains them with :meth:`flush`
  (dora-rs 0.3.x node form, whose ``next()`` borrows the node; the operator form, whose ``send_output`` is
  handed to each ``on_event``).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

import pyarrow as pa

Send = Callable[[str, pa.Array, dict], None]


class DirectTransport:
    def __init__(self, send: Send):
        self._send = send
        self._lock = threading.Lock()

    def send(self, output: str, array: pa.Array, metadata: dict) -> None:
        with self._lock:
            self._send(output, array, metadata)

    def flush(self, send: Send | None = None) -> None:
        """Nothing is ever held back."""


class OutboxTransport:
    def __init__(self):
        self._outbox: deque[tuple[str, pa.Array, dict]] = deque()
        self._lock = threading.Lock()

    def send(self, output: str, array: pa.Array, metadata: dict) -> None:
        self._outbox.append((output, array, metadata))

    def flush(self, send: Send) -> None:
        """Send everything queued so far, in order, from the calling (owning) thread."""
        with self._lock:
            while self._outbox:
                send(*self._outbox.popleft())
