"""Cooperative checkpoints of the text front end: a caller (the engine) installs its :class:`Limits` (data: a cancel
event, a deadline, and what to raise at each) or a check of its own for the current thread, and the front end
checks them at :func:`checkpoint` between chunks, language segments, words and sentences; what stops the work (a
cancelled request, a spent time budget) passes through the front end unchanged. Without anything installed a
checkpoint does nothing."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

_local = threading.local()


@dataclass(frozen=True)
class Limits:
    """What stops the front end, as data (the front end reads it; it calls nothing of the caller's): ``cancel`` set
    raises ``cancelled``; past ``deadline`` (``time.monotonic()``) it raises ``late``."""

    cancel: threading.Event | None = None
    cancelled: BaseException | None = None
    deadline: float | None = None
    late: BaseException | None = None

    def reached(self) -> BaseException | None:
        """What to raise now, or None."""
        if self.cancel is not None and self.cancel.is_set():
            return self.cancelled
        if self.deadline is not None and time.monotonic() > self.deadline:
            return self.late
        return None


@contextlib.contextmanager
def checks(check: Limits | Callable[[], None] | None) -> Iterator[None]:
    """Run the block with ``check`` (:class:`Limits`, or a callable that raises to stop) checked at every checkpoint
    of this thread (None: no checks)."""
    previous = getattr(_local, "check", None)
    _local.check = check
    try:
        yield
    finally:
        _local.check = previous


def checkpoint() -> None:
    """Check the installed limits (or call the installed check); what stops the work is marked so that the front end
    lets it through."""
    check = getattr(_local, "check", None)
    if check is None:
        return
    if isinstance(check, Limits):
        exc = check.reached()
        if exc is not None:
            exc.stops_front_end = True  # type: ignore[attr-defined]
            raise exc
        return
    try:
        check()
    except BaseException as exc:
        exc.stops_front_end = True  # type: ignore[attr-defined]
        raise


def stops(exc: BaseException) -> bool:
    """Whether ``exc`` came from a checkpoint (it is re-raised as it is, not wrapped)."""
    return bool(getattr(exc, "stops_front_end", False))
