"""What a caller that keeps a queue (the node) tells the engine about the audio around its texts, as data it pushes:
the texts it will ask for next and when the audio it sent so far will have played. The engine's streams read it
(``GPTSoVITSEngine.synthesize_stream(listener=board.listener(key))``, engine/stream.py); they never call into the
caller. Plain Python beneath the engine and the dataflow, so that the node holds one before it loads the engine."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import Any


class Board:
    """What a caller that keeps a queue knows about the audio around its texts, as data it pushes (thread-safe):
    :meth:`update` with the texts it will ask for next, in order (``engine.batching.Upcoming``; None: it keeps
    no queue), whenever its queue changes, and :meth:`set_playing_until` with when (``time.perf_counter()``) the
    audio it sent so far will have played (None: nothing), whenever it sends audio. The engine reads the latest
    values (``listener(key)``: the :class:`~.engine.stream.Listener` of the text ``key``); it never calls into the
    caller."""

    def __init__(self, texts: Sequence[Any] | None = None, until: float | None = None):
        self._lock = threading.Lock()
        self._texts = None if texts is None else tuple(texts)
        self._until = until

    def update(self, texts: Sequence[Any] | None) -> None:
        texts = None if texts is None else tuple(texts)
        with self._lock:
            self._texts = texts

    def set_playing_until(self, until: float | None) -> None:
        with self._lock:
            self._until = until

    def texts(self) -> tuple[Any, ...] | None:
        with self._lock:
            return self._texts

    def until(self) -> float | None:
        with self._lock:
            return self._until

    def listener(self, key: Any) -> Posted:
        """The listener of the text ``key`` (one of those the caller lists, or the one it asks for now)."""
        return Posted(key, self)


@dataclasses.dataclass(frozen=True)
class Posted:
    """A :class:`~.engine.stream.Listener` that reads its :class:`Board`: ``upcoming()`` and ``playing_until()``
    are the values the caller pushed last."""

    key: Any
    board: Board

    def upcoming(self) -> Sequence[Any] | None:
        return self.board.texts()

    def playing_until(self) -> float | None:
        return self.board.until()
