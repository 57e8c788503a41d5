"""An input's metadata as the node echoes it on its outputs: sanitised and bounded
(:func:`.metadata.sanitize_metadata`), without dora's send ``timestamp``; a text's also with its ids defaulted and
what was not echoed as sent reported."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .metadata import normalize_segment_index, sanitize_metadata
from .order import TIMESTAMP_KEY


def echoed(metadata: Any, problems: list[str] | None = None) -> dict:
    """The input's metadata as the node echoes it on its outputs, without dora's send ``timestamp``: dora keeps a
    sender's own ``timestamp`` key instead of stamping the send time, so an echoed one would make every output
    (and any text a client sends with metadata copied from it) look sent when the input was. ``problems``
    collects what was not echoed as sent."""
    try:
        md = sanitize_metadata(metadata, problems)
    except Exception as exc:
        if problems is not None:
            problems.append(f"unreadable ({type(exc).__name__}): dropped")
        return {}
    md.pop(TIMESTAMP_KEY, None)
    return md


class TextMetadata:
    """Reads a ``text`` input's metadata; ``log(level, message)`` reports what was not echoed as sent (a
    non-numeric ``segment_index`` once per node)."""

    def __init__(self, log: Callable[[str, str], None]):
        self._log = log
        self._warned_index = False

    def read(self, metadata: Any, arrival: int) -> dict:
        """The echoed metadata of the ``arrival``-th input, with ``question_id`` and ``session_status`` defaulted."""
        problems: list[str] = []
        md = echoed(metadata, problems)
        if problems:
            self._log("WARNING", f"text (arrival {arrival}): metadata not echoed as sent: "
                                 f"{'; '.join(problems)[:1000]}")
        if not normalize_segment_index(md) and not self._warned_index:
            self._warned_index = True
            self._log("WARNING", f"segment_index {md['segment_index']!r} is not a number: passed on unchanged "
                                 "(players compute segment_index + 1)")
        md.setdefault("question_id", "default")
        md.setdefault("session_status", "unknown")
        return md
