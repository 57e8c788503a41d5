"""The LLM text stage's state per stream (``PRIMESPEECH_LLM_TEXT``): one :class:`..text.llm.StreamFilter` per
plain-text session (restarted when its ``question_id`` changes) and one :class:`.sentences.LlmFeed` per streamed
segment (``session_id``, ``segment_id``).

A filter belongs to its stream, not to an utterance: an open ``<think>``, tool call or code block stays closed to
speech across the idle end of an utterance, the end of the oldest utterance when too many are open, and the new
utterance a segment starts when it goes on, until its closing mark. A segment's filter goes at its ``fin`` or
when its utterance is cancelled; a reset or barge-in forgets them all (but those of the utterances it spares).

Bounded: a filter with nothing open (no block, no held text) holds no state and is dropped whenever the table is
full; past :data:`MAX_STREAMS` filters that do hold something, the least recently used one is dropped with one
WARNING, and the text it held is discarded, never spoken."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from ..text import llm
from .sentences import LlmFeed

MAX_STREAMS = 1024  # LLM filters holding an open block or text, kept at once (the least recently used goes)


class Filters:
    """``log(level, message)`` reports an eviction; ``llm_text`` False: segments pass through unchanged (their
    feeds hold no state between utterances) and plain texts have no filter."""

    def __init__(self, log: Callable[[str, str], None], llm_text: bool = True, max_streams: int = MAX_STREAMS):
        self._log = log
        self.llm_text = llm_text
        self.max_streams = max_streams
        self._streams: OrderedDict[tuple, tuple[str | None, object]] = OrderedDict()
        self._pinned: set[tuple] = set()  # the segments of open utterances: never dropped
        self._lock = threading.Lock()
        self.evicted = 0

    # -- plain texts (llm.Sessions' interface) ---------------------------------------------------------------
    def get(self, session: object, question: object) -> llm.StreamFilter:
        """The filter of a plain-text session, restarted when its question changes."""
        key, q = ("text", str(session)), str(question)
        with self._lock:
            found = self._streams.pop(key, None)
            if found is None or found[0] != q:
                found = (q, llm.StreamFilter())
            self._streams[key] = found
            self._bound(key)
            return found[1]

    # -- segments --------------------------------------------------------------------------------------------
    def segment(self, key: tuple[str, str]) -> LlmFeed:
        """The feed of a segment (the same one across its utterances); pinned while its utterance is open."""
        if not self.llm_text:
            return LlmFeed(None)
        k = ("segment", *key)
        with self._lock:
            found = self._streams.pop(k, None)
            if found is None:
                found = (None, LlmFeed(llm.StreamFilter()))
            self._streams[k] = found
            self._pinned.add(k)
            self._bound(k)
            return found[1]

    def release(self, key: tuple[str, str]) -> None:
        """The segment's utterance ended without its ``fin`` (idle wait, too many open): its feed stays."""
        with self._lock:
            self._pinned.discard(("segment", *key))

    def drop(self, key: tuple[str, str]) -> None:
        """The segment is over (``fin``) or cancelled: its feed goes."""
        k = ("segment", *key)
        with self._lock:
            self._pinned.discard(k)
            self._streams.pop(k, None)

    def reset(self, keep: tuple[str, str] | None = None) -> None:
        """Forget every open block (``reset``, a barge-in) but those of open utterances and of segment ``keep``."""
        spared = set(self._pinned) | ({("segment", *keep)} if keep is not None else set())
        with self._lock:
            for k in [k for k in self._streams if k not in spared]:
                del self._streams[k]

    def forget(self, session: str) -> None:
        """A cancel of ``session``: its plain texts' filter and its segments' feeds go (but those of open
        utterances, which the cancel ends itself)."""
        with self._lock:
            for k in [k for k in self._streams if k[1] == str(session) and k not in self._pinned]:
                del self._streams[k]

    def __len__(self) -> int:
        return len(self._streams)

    # -- the bound -------------------------------------------------------------------------------------------
    def _bound(self, current: tuple) -> None:
        """Within MAX_STREAMS, never dropping ``current`` (the filter just handed out) or a pinned one."""
        if len(self._streams) <= self.max_streams:
            return
        kept = self._pinned | {current}
        for k in [k for k, v in self._streams.items() if k not in kept and not _holds(v[1])]:
            del self._streams[k]  # nothing open, nothing held: no state is lost
        while len(self._streams) > self.max_streams:
            k = next((k for k in self._streams if k not in kept), None)
            if k is None:
                return
            _, obj = self._streams.pop(k)
            self.evicted += 1
            what = f"session {k[1]!r}" + (f" segment {k[2]!r}" if k[0] == "segment" else " (plain texts)")
            block = _stream_of(obj).in_block
            self._log("WARNING", f"more than {self.max_streams} LLM text streams hold an open block or text "
                                 f"(MAX_STREAMS): the least recently used, {what}, is dropped"
                                 + (f" with its open {block} block" if block else "")
                                 + "; the text it held is discarded, not spoken")


def _stream_of(obj) -> llm.StreamFilter:
    return obj.stream if isinstance(obj, LlmFeed) else obj


def _holds(obj) -> bool:
    """Whether a filter (or a segment's feed) holds state: an open block, or text not yet read."""
    if isinstance(obj, LlmFeed):
        return bool(obj.held) or (obj.stream is not None and obj.stream.in_block is not None)
    return obj.in_block is not None


__all__ = ["Filters", "MAX_STREAMS"]
