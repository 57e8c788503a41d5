"""Continuous batching in the engine: which sentences decode together in the GPT (``models/gpt/batch.py``).

The engine keeps one :class:`~..models.gpt.batch.DecodeBatch` for the voice in use (:class:`Batching`). A request's
sentence gets its row (its prefill) when its turn comes, and earlier while another sentence is read: the request's
own later sentences, then the texts queued behind it (:class:`Upcoming`, e.g. the node's queued messages; same
voice, each with its own settings) join the running decode once the listener has :data:`ADMIT_QUEUED_S` of audio in
hand, and only where the stream's pacer says the listener stays fed through the joining sentence's start (a prefill
stalls the stream for its duration) and its slower steps (``pacing.Pacer.admits``, asked through ``allows``). One
sentence joins per decision, so a stall is one prefill. A
queued text that joins is prepared (front end, BERT, seed) at that moment; its own request later finds it by its key
and goes on from the tokens already decoded. Each sentence's tokens are those of its decode alone with the same
seed; only when they are computed changes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..models.gpt.batch import DecodeBatch, Row
from . import pipeline
from .stats import Timer, stage

ADMIT_QUEUED_S = 1.5  # a stream admits a waiting sentence only while this much sent audio is still unplayed
UPCOMING_EVERY_S = 0.1  # how often a stream reads the texts queued behind it (from its listener: the caller's board)


@dataclass(frozen=True)
class Upcoming:
    """A text queued behind the request being spoken, as the caller will ask for it (``synthesize_stream``'s
    ``text``, ``voice``, ``overrides`` and ``key``)."""

    key: Any
    text: str
    voice: Any = None
    overrides: dict = field(default_factory=dict)
    cancel: threading.Event | None = None


@dataclass
class Joined:
    """A queued text prepared to join the batch: its request (``core._Request``) and what it was asked with."""

    request: Any
    upcoming: Upcoming


def add_row(batch: DecodeBatch, request, s: int, timer: Timer) -> Row:
    """Give sentence ``s`` of ``request`` its row in ``batch``: its BERT (if missing) and its prefill, now."""
    pipeline.fill_bert(request.chunks, s, request.spec, request.models, timer)
    t0 = time.perf_counter()
    with stage("gpt"):
        gen = pipeline.start_generation(request.models, request.ref, request.chunks[s], request.cfg, request.seed + s)
    timer.add("gpt_prefill", time.perf_counter() - t0)
    row = request.rows[s] = batch.add(gen)
    return row


class Batching:
    """The engine's decode batch and the queued texts that joined it. Used under the engine lock."""

    def __init__(self):
        self.batch: DecodeBatch | None = None
        self._owner: tuple | None = None
        self.joined: dict[Any, Joined] = {}  # by key, in queue order
        self.refused: set = set()  # keys of queued texts that cannot join (their own request reports why)
        self._asked = 0.0

    def as_dict(self) -> dict[str, Any]:
        """For ``stats``: the batch's width, its steps, rows per step on average, the queued texts joined now."""
        b = self.batch
        if b is None:
            return {"width": None, "steps": 0, "rows_per_step": None, "joined": 0}
        return {"width": b.max_rows, "steps": b.steps,
                "rows_per_step": round(b.row_steps / b.steps, 3) if b.steps else None, "joined": len(self.joined)}

    def batch_for(self, request, width: int) -> DecodeBatch:
        """The batch ``request``'s sentences decode in: the current one when it serves the same GPT at the same
        width, else a new one (the old one's rows and joined texts are dropped)."""
        owner = (id(request.models.gpt), width)
        if self.batch is None or self._owner != owner:
            self.drop_joined()
            self.batch, self._owner = DecodeBatch(width), owner
        return self.batch

    def admit(self, request, s: int, timer: Timer) -> Row:
        """Give sentence ``s`` of ``request`` its row in the engine's batch (:func:`add_row`)."""
        return add_row(self.batch, request, s, timer)

    def drop(self, request) -> None:
        """Take ``request``'s rows out of the batch (cancelled, failed or abandoned)."""
        if self.batch is not None:
            for row in request.rows.values():
                self.batch.drop(row)
        request.rows.clear()

    def drop_joined(self, keep: Any = None) -> None:
        """Forget the joined texts (all but ``keep``) and drop their rows."""
        for key in [k for k in self.joined if k != keep]:
            self.drop(self.joined.pop(key).request)

    def reconcile(self, queued: Sequence[Upcoming]) -> list[Upcoming]:
        """Drop the joined texts no longer queued (answered, cancelled by a reset); returns ``queued`` as a list."""
        queued = list(queued)
        wanted = {u.key for u in queued if u.cancel is None or not u.cancel.is_set()}
        for key in [k for k in self.joined if k not in wanted]:
            self.drop(self.joined.pop(key).request)
        self.refused &= wanted
        return queued

    def take(self, key: Any, text, voice, overrides: dict):
        """The joined request for ``key`` when it was prepared from the same text, voice and overrides (it goes on
        from its decoded tokens), else None (a joined text that changed is dropped)."""
        j = self.joined.pop(key, None) if key is not None else None
        if j is None:
            return None
        u = j.upcoming
        if (u.text, u.voice, dict(u.overrides)) != (text, voice, dict(overrides)):
            self.drop(j.request)
            return None
        return j.request

    def poll(self, upcoming: Callable[[], Sequence[Upcoming] | None] | None) -> list[Upcoming] | None:
        """The queued texts, asked of ``upcoming`` (the listener's: values the caller pushed, board.py) at most every
        :data:`UPCOMING_EVERY_S` and reconciled with the joined ones (a cancelled text's row must not keep
        stepping); None when not asked now or the caller keeps no queue."""
        if self.batch is None or self.batch.max_rows <= 1 or upcoming is None:
            return None
        if time.monotonic() - self._asked < UPCOMING_EVERY_S:
            return None
        asked, listed = time.monotonic(), upcoming()
        if listed is None:  # (the caller keeps no queue)
            return None
        self._asked = asked
        return self.reconcile(listed)

    def has_room(self, queued_s: float | None) -> bool:
        """Whether a sentence may join now: a batch wider than one row with room, and at least
        :data:`ADMIT_QUEUED_S` of audio queued for the listener (``queued_s``; None: nothing is playing)."""
        b = self.batch
        return (b is not None and b.max_rows > 1 and b.room > 0 and queued_s is not None
                and queued_s >= ADMIT_QUEUED_S)

    def open_sentence(self, request, after: int = -1) -> int | None:
        """The first sentence of ``request`` after ``after`` without a row in the batch, or None."""
        return next((s for s in range(after + 1, len(request.chunks)) if s not in request.rows), None)

    def may_join(self, u: Upcoming) -> bool:
        """Whether the queued text ``u`` is still a candidate (not cancelled, not refused)."""
        return not ((u.cancel is not None and u.cancel.is_set()) or u.key in self.refused)

    def join(self, u: Upcoming, request) -> Joined | None:
        """Record the queued text ``u`` as joined with its prepared ``request`` (None: it cannot join, refused)."""
        if request is None:
            self.refused.add(u.key)
            return None
        j = self.joined[u.key] = Joined(request, u)
        return j


def solo(batch: DecodeBatch, steps: int, row_steps: int, tokens: int) -> bool:
    """Whether ``tokens`` tokens read since the batch stood at ``steps`` / ``row_steps`` each took a step of one row:
    then their seconds are the GPT's speed alone (tokens decoded beside other rows, or earlier, are not)."""
    stepped = batch.steps - steps
    return stepped >= tokens and batch.row_steps - row_steps == stepped
