"""The one answer of each text and utterance: ``completed``, ``skipped`` or ``error``, with what goes before it
(silence, a ``status``). Every answer claims its job (or utterance) first and is sent under one lock
(:attr:`Answers.lock`), so no path answers twice and a reset on the input thread never overtakes the worker's
answer to an earlier text. A sentence's outcome goes to its utterance, which answers once all its sentences have."""

from __future__ import annotations

import threading
from collections.abc import Callable

from .cancellation import CANCEL_STAGES
from .jobs import Job
from .messages import ERROR_MAX_CHARS, clip
from .outputs import Outputs
from .utterance import Heard, Utterance


class Answers:
    def __init__(self, outputs: Outputs):
        self.out = outputs
        self.lock = threading.RLock()  # segment_complete answers, in input order

    def complete(self, job: Job, outcome: str, before: Callable[[], None] | None = None,
                 reason: str | None = None, status: tuple[str, dict] | None = None) -> bool:
        """Claim the job, then send what goes with its answer (``before``: silence, a status; ``status``: a
        ``status`` message, (its name, its fields)) and its one ``segment_complete`` (with ``reason``, if given; a
        sentence's outcome goes to its utterance instead); False (and nothing sent) if it was answered already."""
        with self.lock:
            if not job.claim():
                return False
            if before is not None or status is not None:
                try:
                    if before is not None:
                        before()
                    if status is not None:
                        self.out.status(status[0], job.metadata, **status[1])
                except Exception as exc:  # the answer itself goes out whatever happened to what precedes it
                    self.out.log("ERROR", f"text #{job.seq}: {type(exc).__name__}: {exc}")
            if job.utterance is not None:
                self.part_done(job, outcome, reason)
            else:
                self.out.answer(job.metadata, outcome, reason, None, f"text #{job.seq}")
            return True

    def skip(self, job: Job, reason: str = "nothing to speak", level: str = "DEBUG") -> None:
        """Nothing to speak: ``skipped`` with its ``reason`` on ``log`` (at ``level``), on a ``skipped`` status and
        on the ``segment_complete`` (a plain text's with its silence)."""

        def before() -> None:
            self.out.log(level, f"text #{job.seq} ({describe(job.metadata)}): skipped: {reason}")
            if job.utterance is None:
                self.out.silence(job)
            self.out.status("skipped", job.metadata, level=level if level != "DEBUG" else "INFO", message=reason,
                            reason=reason, seq=job.seq)

        self.complete(job, "skipped", before, reason)

    def fail(self, job: Job, error: str, stage: str) -> bool:
        """Answer ``job`` with an error: claimed first, so a text gets one ``status: error`` and one
        ``segment_complete`` whoever else (worker, reset, STOP, supervisor) tries to answer it at the same time.
        A sentence of an utterance reports to its utterance; cancelled with it, it sends nothing (False)."""
        error = clip(error, ERROR_MAX_CHARS)
        with self.lock:
            if not job.claim():
                return False
            if job.utterance is not None and stage in CANCEL_STAGES:
                return False
            if stage not in CANCEL_STAGES and job.utterance is None:
                self.out.silence(job)
            level = "WARNING" if stage in (*CANCEL_STAGES, "busy") else "ERROR"
            self.out.log(level, f"text #{job.seq} ({describe(job.metadata)}): {stage} error: {error}")
            heard = heard_of(job) if stage in CANCEL_STAGES and job.utterance is None else {}
            try:
                self.out.status("error", job.metadata, level=level, message=error, error=error, reason=error,
                                error_stage=stage, seq=job.seq, **heard)
            except Exception as exc:
                self.out.log("ERROR", f"status for text #{job.seq} not sent: {type(exc).__name__}: {exc}")
            if job.utterance is not None:
                self.part_done(job, "error", error, stage)
            else:
                self.out.answer({**job.metadata, **heard}, "error", error, stage, f"text #{job.seq}")
            return True

    def part_done(self, job: Job, outcome: str, error: str | None = None, stage: str | None = None) -> None:
        """A sentence of an utterance is answered; the utterance is, once complete."""
        if job.utterance.part_done(outcome, error, stage):
            self.utterance(job.utterance)

    def closed(self, utterance: Utterance) -> None:
        """Intake: ``utterance`` takes no more sentences; answered here if all of them are."""
        if utterance.complete:
            self.utterance(utterance)

    def utterance(self, utterance: Utterance, cancelled: tuple[str, str] | None = None) -> bool:
        """The one ``segment_complete`` of an utterance (its metadata: the first fragment's), after a ``fin``
        audio chunk if its last audio went out before its end was known, or its silence if nothing was spoken.
        ``cancelled``: (reason, stage) of a reset, barge-in or STOP."""
        with self.lock:
            if not utterance.claim():
                return False
            self.out.counts.add("texts")
            self.out.counts.add("utterances")
            if cancelled is not None:  # with what of it went out (the listener heard it)
                heard = utterance.heard.report()
                try:
                    self.out.status("cancelled", utterance.metadata, level="WARNING", message=cancelled[0],
                                    error=cancelled[0], error_stage=cancelled[1], **heard)
                except Exception as exc:
                    self.out.log("ERROR", f"status for {what(utterance)} not sent: {type(exc).__name__}: {exc}")
                self.out.answer({**utterance.metadata, **heard}, "error", cancelled[0], cancelled[1], what(utterance))
                return True
            outcome, error, stage = utterance.outcome()
            try:
                if outcome != "completed":
                    self.out.silence(None, utterance)
                elif not utterance.fin_sent:
                    self.out.silence(None, utterance, always=True)
            except Exception as exc:  # the answer goes out whatever happened before it
                self.out.log("ERROR", f"{what(utterance)}: {type(exc).__name__}: {exc}")
            self.out.answer(utterance.metadata, outcome, error, stage, what(utterance))
            return True


def heard_of(job: Job) -> dict:
    """What of a cancelled plain text went out (:meth:`.utterance.Heard.report`)."""
    if job.heard is not None:
        return job.heard.report()
    return Heard(getattr(job.request, "text", "") or "").report()


def what(utterance: Utterance) -> str:
    return f"session {utterance.key[0]!r} segment {utterance.key[1]!r}"


def describe(md: dict) -> str:
    """The ids a log line names a text by."""
    keys = ("question_id", "session_id", "segment_index")
    return ", ".join(f"{k}={md[k]}" for k in keys if k in md) or "no ids"
