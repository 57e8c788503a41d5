"""The send order of the node's inputs, which dora does not keep across inputs: under a backlog dora 1.1
delivers the queued ``text`` and ``control`` events alternately, not in the order they were sent.

Every input gets a :class:`Stamp` from its metadata:

- ``timestamp``: the send time dora 1.x puts in every message's metadata (the sender's hybrid logical clock,
  a timezone-aware ``datetime``); comparable across the senders of one dataflow;
- ``seq``: an integer the sender may add to the metadata of its texts and controls, increasing by message;
  it orders messages with equal timestamps, and all of them where there is no timestamp (dora 0.3.x);
- the arrival number: the order the node received them, the fallback when neither is present.

A ``timestamp`` cannot reach into the future: one ahead of the node's clock by more than :data:`MAX_SKEW_S` is
clamped to the arrival time (:func:`clamp`), so a forged or skewed send time can neither make a reset or
barge-in cancel what is sent after it nor make a text outlast one.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import Any

SEQ_KEY = "seq"
TIMESTAMP_KEY = "timestamp"
MAX_SKEW_S = 1.0  # a timestamp further ahead of the node's clock is clamped to the arrival time


@dataclass(frozen=True)
class Stamp:
    time: _dt.datetime | None
    seq: int | None
    arrival: int

    def before(self, other: Stamp) -> bool:
        """Whether this message was sent before ``other``."""
        if self.time is not None and other.time is not None and self.time != other.time:
            return self.time < other.time
        if self.seq is not None and other.seq is not None and self.seq != other.seq:
            return self.seq < other.seq
        return self.arrival < other.arrival


def stamp(metadata: Any, arrival: int) -> Stamp:
    """The stamp of an input from its raw metadata (anything unusable counts as absent)."""
    time = seq = None
    if isinstance(metadata, dict):
        t = metadata.get(TIMESTAMP_KEY)
        if isinstance(t, _dt.datetime) and t.tzinfo is not None:
            time = t
        s = metadata.get(SEQ_KEY)
        if isinstance(s, int) and not isinstance(s, bool):
            seq = s
    return Stamp(time, seq, arrival)


def clamp(st: Stamp, now: _dt.datetime | None = None) -> tuple[Stamp, bool]:
    """``st`` with a ``timestamp`` more than :data:`MAX_SKEW_S` ahead of ``now`` (the node's clock, UTC) set to
    ``now``; True when it was clamped."""
    if st.time is None:
        return st, False
    now = now or _dt.datetime.now(_dt.timezone.utc)
    try:
        ahead = (st.time - now).total_seconds()
    except (OverflowError, TypeError):
        ahead = 0.0
    if ahead <= MAX_SKEW_S:
        return st, False
    return Stamp(now, st.seq, st.arrival), True
