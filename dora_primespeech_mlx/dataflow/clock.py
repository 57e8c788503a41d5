"""The playback clock: when the audio sent so far will have played (``time.perf_counter``), for a player that
starts each chunk on arrival or when the one before it ends. A stream plans its first pieces with that audio in
hand (the engine's ``playing_until``, pushed onto the clock's ``board``, the :class:`~..board.Board` the
node's streams read); a reset or a barge-in forgets it (the player drops what it holds)."""

from __future__ import annotations

import threading
import time

from ..board import Board


class PlaybackClock:
    def __init__(self, board: Board | None = None):
        self._until: float | None = None
        self._lock = threading.Lock()
        self.board = board if board is not None else Board([])

    @property
    def until(self) -> float | None:
        return self._until

    def sent(self, seconds: float) -> None:
        """``seconds`` of audio were just sent."""
        with self._lock:
            now = time.perf_counter()
            self._until = max(now, self._until or now) + seconds
            self.board.set_playing_until(self._until)

    def forget(self) -> None:
        with self._lock:
            self._until = None
            self.board.set_playing_until(None)
