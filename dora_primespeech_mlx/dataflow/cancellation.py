"""What a ``reset``, a barge-in (``flush: true``) or STOP cancels, in send order (:mod:`.order`).

:class:`Marks` remembers the latest reset and barge-in, so a message sent before one of them that arrives after
it is cancelled on arrival. :func:`collect` takes what was sent before a stamp out of the intake and the work
queue, signals the job in flight to stop (the engine stops at its next checkpoint) and returns it all, to be
answered once each by the caller."""

from __future__ import annotations

from typing import Any

from .order import Stamp

CANCELLED = "cancelled by reset"
FLUSHED = "cancelled by a barge-in (flush)"
STOPPING = "cancelled: the node is stopping"
CANCEL_STAGES = ("reset", "flush", "stop")


class Marks:
    def __init__(self):
        self._marks: dict[str, Stamp | None] = {"reset": None, "flush": None}

    def note(self, stage: str, st: Stamp | None) -> None:
        """A reset or barge-in (``stage``) sent at ``st``; the latest one counts."""
        mark = self._marks[stage]
        if st is not None and (mark is None or mark.before(st)):
            self._marks[stage] = st

    def cancelled(self, st: Stamp | None) -> tuple[str, str] | None:
        """(reason, stage) when a message sent at ``st`` was sent before the latest reset or barge-in."""
        if st is None:
            return None
        for stage, reason in (("reset", CANCELLED), ("flush", FLUSHED)):
            mark = self._marks[stage]
            if mark is not None and st.before(mark):
                return reason, stage
        return None


def collect(intake, jobs, reason: str, stage: str, before: Stamp | None = None,
            keep: tuple[str, str] | None = None) -> tuple[list[Any], list[Any], list[Any]]:
    """Under ``intake.hold()``: take every text and utterance sent before ``before`` (all when None) but the
    utterance ``keep`` out of the intake and the queue, and signal the text in flight to stop. Returns (texts
    never admitted, admitted texts and sentences with the one in flight first, utterances) — each utterance
    once, also those only their sentences name; the caller answers them."""

    def spared(job) -> bool:
        return keep is not None and job.utterance is not None and job.utterance.key == keep

    waiting, utterances = intake.take(before, keep)
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
