"""What a ``reset``, a barge-in (``flush: true``) or STOP cancels, in send order (:mod:`.order`).

:class:`Marks` remembers the latest reset and barge-in, so a message sent before one of them that arrives after
it is cancelled on arrival. :func:`collect` takes what was sent before a stamp out of the intake and the work
queue, signals the job in flight to stop (the engine stops at its next checkpoint) and returns it all;
:class:`Canceller` answers each of them once and reports the reset or barge-in."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

from .order import Stamp
from .sentences import LlmFeed
from .utterance import Utterance, session_of, without_convention

CANCELLED = "cancelled by reset"
FLUSHED = "cancelled by a barge-in (flush)"
STOPPING = "cancelled: the node is stopping"
SESSION_CANCELLED = "cancelled by a cancel of its session"
CANCEL_STAGES = ("reset", "flush", "stop", "cancel")
SESSION_MARK_S = 300.0  # a session's cancel stops what was sent before it from arriving for this long
MAX_SESSION_MARKS = 100_000  # session cancels remembered at once, whatever the window (the oldest goes first)


class Marks:
    def __init__(self):
        self._marks: dict[str, Stamp | None] = {"reset": None, "flush": None}
        # the latest cancel of each session and until when it is kept (monotonic), the oldest first: kept for a
        # time, not a count, so a sender cannot push one out by cancelling many other sessions
        self._sessions: OrderedDict[str, tuple[Stamp, float]] = OrderedDict()

    def note_session(self, session: str, st: Stamp | None) -> None:
        """A cancel of ``session`` sent at ``st``; the latest one counts."""
        now = time.monotonic()
        mark = self._sessions.pop(session, (None, 0.0))[0]
        if st is not None and (mark is None or mark.before(st)):
            mark = st
        if mark is not None:
            self._sessions[session] = (mark, now + SESSION_MARK_S)
        while self._sessions and (len(self._sessions) > MAX_SESSION_MARKS
                                  or next(iter(self._sessions.values()))[1] <= now):
            self._sessions.popitem(last=False)

    def note(self, stage: str, st: Stamp | None) -> None:
        """A reset or barge-in (``stage``) sent at ``st``; the latest one counts."""
        mark = self._marks[stage]
        if st is not None and (mark is None or mark.before(st)):
            self._marks[stage] = st

    def cancelled(self, st: Stamp | None, session: str | None = None) -> tuple[str, str] | None:
        """(reason, stage) when a message sent at ``st`` was sent before the latest reset or barge-in (or, of
        ``session``, before the latest cancel of that session)."""
        if st is None:
            return None
        for stage, reason in (("reset", CANCELLED), ("flush", FLUSHED)):
            mark = self._marks[stage]
            if mark is not None and st.before(mark):
                return reason, stage
        kept = self._sessions.get(session) if session is not None else None
        if kept is not None and kept[1] > time.monotonic() and st.before(kept[0]):
            return SESSION_CANCELLED, "cancel"
        return None


def collect(intake, jobs, reason: str, stage: str, before: Stamp | None = None,
            keep: tuple[str, str] | None = None, session: str | None = None) -> tuple[list[Any], list[Any], list[Any]]:
    """Under ``intake.hold()``: take every text and utterance sent before ``before`` (all when None) but the
    utterance ``keep`` (``session``: only those of that session) out of the intake and the queue, and signal the
    text in flight to stop. Returns (texts never admitted, admitted texts and sentences with the one in flight
    first, utterances) — each utterance once, also those only their sentences name; the caller answers them."""

    def spared(job) -> bool:
        if session is not None and session_of(job.metadata) != session:
            return True
        return keep is not None and job.utterance is not None and job.utterance.key == keep

    waiting, utterances = intake.take(before, keep, session)
    queued, current = jobs.take(("text",), before, spared)
    if current is not None and not current.answered and not current.cancel.is_set():
        current.error, current.error_stage = reason, stage
        current.cancel.set()  # the engine stops at its next cancellation point; its answer is the caller's
        queued.insert(0, current)
    for job in queued:
        if job.utterance is not None and job.utterance not in utterances:
            utterances.append(job.utterance)
    for utterance in utterances:
        intake.forget(utterance.key)  # its late fragments are dropped
    return waiting, queued, utterances


class Canceller:
    """Reset, barge-in and STOP: cancels what :func:`collect` finds and answers each text and utterance once
    (``answers``: :class:`.answers.Answers`); ``sessions``: the plain texts' LLM filters (forgotten on a reset or
    barge-in), ``clock``: the playback clock (forgotten: the player drops what it holds)."""

    def __init__(self, intake, jobs, answers, sessions, clock):
        self.intake, self.jobs, self.answers = intake, jobs, answers
        self.out = answers.out
        self.sessions, self.clock = sessions, clock
        self.marks = Marks()

    def cancel(self, reason: str, stage: str, before: Stamp | None = None,
               keep: tuple[str, str] | None = None, session: str | None = None) -> int:
        """Cancel the texts and utterances sent before ``before`` (all when None) but the utterance ``keep``
        (``session``: only that session's); each text and utterance counts (and is answered) once. Returns how
        many."""
        with self.intake.hold(), self.answers.lock:
            waiting, queued, utterances = collect(self.intake, self.jobs, reason, stage, before, keep, session)
            self.out.counts.add("texts", len(waiting))  # counted when admitted, which these never were
            n = sum(self.answers.fail(job, reason, stage) for job in [*queued, *waiting])  # in flight first
            n += sum(self.answers.utterance(u, (reason, stage)) for u in utterances)
            self.out.counts.add("cancelled", n)
            return n

    def late_fragment(self, key: tuple[str, str], md: dict, st: Stamp | None, seq: int | None,
                      cancelled: tuple[str, str] | None) -> bool:
        """A fragment sent before a reset or barge-in that arrives after it (``cancelled``: its reason and stage;
        also STOP), or of a cancelled utterance: True when it is dealt with here. Its utterance, if new (neither
        open, queued, ended nor cancelled), is answered once as cancelled and its later fragments are dropped; one
        of a cancelled or ended utterance is dropped; one of an utterance still assembled goes on (False)."""
        what = f"fragment of session {key[0]!r} segment {key[1]!r}"
        with self.intake.hold(), self.answers.lock:
            if self.intake.forgotten(key):
                self.out.log("DEBUG", f"{what} dropped (its utterance was cancelled)")
                return True
            if cancelled is None or (cancelled[1] != "stop" and self.intake.live(key)):
                return False
            if self.intake.repeat(key, seq):
                self.out.log("WARNING", f"{what} seq {seq} dropped: sent before a {cancelled[1]}, and that part of "
                                        "the segment ended already")
                return True
            self.intake.forget(key)
            self.out.log("WARNING", f"{what}: sent before a {cancelled[1]} that arrived first: its utterance is "
                                    f"answered as cancelled")
            n = self.answers.utterance(Utterance(key, md, st, LlmFeed(None)), cancelled)
            self.out.counts.add("cancelled", int(n))
            return True

    def reset(self, md: dict, st: Stamp | None = None) -> None:
        """``reset``: cancel every text sent before it and report how many on ``status``."""
        if self.sessions is not None:
            self.sessions.reset()  # open reasoning/code blocks are forgotten with the texts
        self.marks.note("reset", st)
        n = self.cancel(CANCELLED, "reset", st)
        self.clock.forget()  # a player may drop what it holds on a reset: the next text plans without it
        self.out.log("INFO", f"reset: {n} text(s) cancelled")
        self.out.status("reset", md, message=f"reset: {n} text(s) cancelled", cancelled=n)

    def barge_in(self, md: dict, st: Stamp | None, keep: tuple[str, str] | None) -> None:
        """``flush: true``: cancel every text and utterance sent before this message (but the utterance it starts
        or continues, ``keep``); the next audio carries ``flush: true`` so dora empties the player's queue."""
        self.marks.note("flush", st)
        n = self.cancel(FLUSHED, "flush", st, keep)
        if self.sessions is not None:
            self.sessions.reset(keep)  # the open reasoning/code blocks go with them (but the new utterance's)
        self.clock.forget()
        self.out.log("INFO", f"flush: {n} text(s) cancelled")
        self.out.flush_next(lambda: self.out.status("flush", without_convention(md),
                                                    message=f"flush: {n} text(s) cancelled", cancelled=n))

    def cancel_session(self, session: str, md: dict, st: Stamp | None = None) -> None:
        """``cancel`` of one session: cancel that session's texts and utterances sent before it (queued, in the
        intake, being spoken) and report how many on ``status``; the other sessions go on speaking. The audio is
        not marked ``flush`` (dora would empty the player's whole queue, the other sessions' audio with it)."""
        self.marks.note_session(session, st)
        n = self.cancel(SESSION_CANCELLED, "cancel", st, session=session)
        if self.sessions is not None:
            self.sessions.forget(session)  # its plain texts' open reasoning/code blocks go with them
        self.out.log("INFO", f"cancel of session {session!r}: {n} text(s) cancelled")
        self.out.status("cancel", without_convention(md), message=f"session {session}: {n} text(s) cancelled",
                        cancelled=n, session=session)
