"""Cooperative checkpoints of the text front end: a caller (the engine) installs a check for the current thread,
and the front end calls :func:`checkpoint` between chunks, language segments, words and sentences. The check
raises to stop the work (a cancelled request, a spent time budget); that exception passes through the front end
unchanged. Without an installed check a checkpoint does nothing."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

_local = threading.local()


@contextlib.contextmanager
def checks(check: Callable[[], None] | None) -> Iterator[None]:
    """Run the block with ``check`` called at every checkpoint of this thread (None: no checks)."""
    previous = getattr(_local, "check", None)
    _local.check = check
    try:
        yield
    finally:
        _local.check = previous


def checkpoint() -> None:
    """Call the installed check; what it raises is marked so that the front end lets it through."""
    check = getattr(_local, "check", None)
    if check is None:
        return
    try:
        check()
    except BaseException as exc:
        exc.stops_front_end = True  # type: ignore[attr-defined]
        raise


def stops(exc: BaseException) -> bool:
    """Whether ``exc`` came from a checkpoint (it is re-raised as it is, not wrapped)."""
    return bool(getattr(exc, "stops_front_end", False))
