"""How outputs reach dora, behind one interface (``send(output_id, array, metadata)``), so the handler never
touches the dora API. Only the subset shared by dora-rs 0.3.x and 1.x is used (``send_output(id, pa.Array,
dict)``).

- :class:`DirectTransport` calls a send function at once (dora-rs 1.x node form: the worker may send while the
  main thread waits in ``next()``; tests pass a recorder);
- :class:`OutboxTransport` queues outputs for a thread that owns the sender and drains them with :meth:`flush`
  (dora-rs 0.3.x node form, whose ``next()`` borrows the node; the operator form, whose ``send_output`` is
  handed to each ``on_event``).

Both send through :func:`send_safely`: when dora refuses an output's metadata (an int outside int64 raises
``OverflowError``, a mixed list ``TypeError``, ...) the output is sent again with every value as a bounded
string, so an answer is never lost to its metadata (the handler's sanitising should leave nothing to refuse).
"""

from __future__ import annotations

import datetime
import sys
import threading
from collections import deque
from collections.abc import Callable

import pyarrow as pa

Send = Callable[[str, pa.Array, dict], None]
FALLBACK_CHARS = 1024  # each metadata value of an output sent again as a string is cut to this length
METADATA_ERRORS = (OverflowError, TypeError, ValueError, RuntimeError)  # what dora raises for metadata it refuses


def send_safely(send: Send, output: str, array: pa.Array, metadata: dict) -> None:
    """``send(output, array, metadata)``; when that raises one of METADATA_ERRORS, again with the metadata as
    strings (raises if that fails too: the error is not the metadata's)."""
    try:
        send(output, array, metadata)
        return
    except METADATA_ERRORS as exc:
        if all(isinstance(k, str) and _native(v) for k, v in metadata.items()):
            raise  # not the metadata's fault (the caller's retry, if any, sends it as it is)
        plain = {_text(k, FALLBACK_CHARS): _text(v, FALLBACK_CHARS) for k, v in metadata.items()}
        print(f"[primespeech] WARNING {output} not sent ({type(exc).__name__}: {_text(exc, 200)}); sending it "
              "with its metadata as strings", file=sys.stderr, flush=True)
    send(output, array, plain)


def _native(value) -> bool:
    """Whether dora sends ``value`` as it is (docs/dataflow.md, "Outputs": its integers are int64)."""
    if isinstance(value, (bool, str, float, datetime.datetime)):
        return True
    if isinstance(value, int):
        return -(2**63) <= value < 2**63
    if isinstance(value, list):
        kinds = {type(v) for v in value}
        return kinds in (set(), {str}, {float}) or (kinds == {int} and all(map(_native, value)))
    return False


def _text(value, limit: int) -> str:
    try:
        text = value if isinstance(value, str) else str(value)
    except Exception as exc:  # an int of more than 4300 digits, a str() that fails
        text = f"<{type(exc).__name__}>"
    return text[:limit]


class DirectTransport:
    def __init__(self, send: Send):
        self._send = send
        self._lock = threading.Lock()

    def send(self, output: str, array: pa.Array, metadata: dict) -> None:
        with self._lock:
            send_safely(self._send, output, array, metadata)

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
                output, array, metadata = self._outbox.popleft()
                try:
                    send_safely(send, output, array, metadata)
                except Exception as exc:  # one output lost, not the node (this runs on the main thread)
                    print(f"[primespeech] ERROR {output} not sent: {type(exc).__name__}: {_text(exc, 300)}",
                          file=sys.stderr, flush=True)
