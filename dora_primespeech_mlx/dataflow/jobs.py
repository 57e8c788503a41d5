"""The node's work queue: one FIFO of jobs (texts and ``change_voice``, which keeps its place among the texts),
a bound on queued texts, and the job in flight. Every text job is answered exactly once: :meth:`Job.claim`
is the single gate every answer passes (the worker's result, a ``reset``, a STOP, a supervisor's rescue)."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Job:
    kind: str  # "text" | "control"
    metadata: dict
    seq: int = 0
    request: Any = None  # messages.TextRequest
    command: Any = None  # messages.ControlCommand
    error: str | None = None  # input already known to be bad, or why the job was cancelled
    error_stage: str = "input"
    stamp: Any = None  # order.Stamp: when it was sent (None: runs in arrival order)
    cancel: threading.Event = field(default_factory=threading.Event)
    raw: str | None = None  # the text as it came, until the intake parses it
    skip: bool = False  # nothing to speak (checked once, when the job is admitted)
    utterance: Any = None  # utterance.Utterance this sentence belongs to (None: a text of its own)
    part: int = 0  # the sentence's number within its utterance
    voice: Any = None  # the voice resolved for it (once; a change_voice clears it)
    heard: Any = None  # utterance.Heard of a plain text (a sentence's goes to its utterance's)
    answered: bool = False  # claimed: its one answer is sent (set by claim() alone)
    answer_lock: threading.RLock = field(default_factory=threading.RLock)  # held while audio of the job is sent

    def claim(self) -> bool:
        """True exactly once: the caller that gets True sends the job's one answer."""
        with self.answer_lock:
            if self.answered:
                return False
            self.answered = True
            return True


class QueueFull(Exception):
    """More texts are waiting than the node accepts (``MAX_QUEUED_TEXTS``)."""


class JobQueue:
    """FIFO of jobs plus the one in flight; ``idle`` means nothing queued and nothing running. ``on_change(jobs)``
    is given the jobs waiting, in order, whenever they change (under the queue's lock, so in the order they did):
    the speaker publishes them to the engine (:meth:`.speech.Speaker.publish`)."""

    def __init__(self, max_texts: int = 1000, on_change: Callable[[list[Job]], None] | None = None):
        self.max_texts = max_texts
        self.on_change = on_change
        self._jobs: deque[Job] = deque()
        self._cv = threading.Condition()
        self.current: Job | None = None
        self.closed = False
        self.text_arrived = threading.Event()  # set by the first text queued (the start-up's warm-up gives way)

    def put(self, job: Job, front: bool = False) -> None:
        """Queue ``job`` in send order: before the queued jobs sent after it (their stamps), else at the end;
        ``front``: before every queued job."""
        with self._cv:
            if job.kind == "text" and sum(j.kind == "text" for j in self._jobs) >= self.max_texts:
                raise QueueFull(f"busy: {self.max_texts} texts are already waiting (MAX_QUEUED_TEXTS)")
            if front:
                self._jobs.appendleft(job)
            else:
                at = len(self._jobs)
                while at > 0 and _sent_before(job, self._jobs[at - 1]):
                    at -= 1
                self._jobs.insert(at, job)
            if job.kind == "text":
                self.text_arrived.set()
            self._changed()
            self._cv.notify_all()

    def get(self, timeout: float) -> Job | None:
        """The next job (now in flight), or None after ``timeout`` seconds or once closed and empty."""
        with self._cv:
            if not self._cv.wait_for(lambda: self._jobs or self.closed, timeout) or not self._jobs:
                return None
            self.current = self._jobs.popleft()
            self._changed()
            return self.current

    def done(self) -> None:
        with self._cv:
            self.current = None
            self._cv.notify_all()

    def take(self, kinds: tuple[str, ...] = ("text",), before: Any = None,
             spare: Callable[[Job], bool] | None = None) -> tuple[list[Job], Job | None]:
        """Remove the queued jobs of ``kinds`` (only those sent before the stamp ``before``, when given, and
        not ``spare(job)``); return them and the job in flight (if of those kinds, sent before ``before``, not
        spared)."""

        def wanted(j: Job | None) -> bool:
            return (j is not None and j.kind in kinds and (before is None or j.stamp is None or j.stamp.before(before))
                    and not (spare is not None and spare(j)))

        with self._cv:
            taken = [j for j in self._jobs if wanted(j)]
            self._jobs = deque(j for j in self._jobs if not wanted(j))
            current = self.current if wanted(self.current) else None
            if taken:
                self._changed()
            return taken, current

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(list(self._jobs))

    def close(self) -> None:
        """No more jobs: ``get`` returns None once the queue is empty."""
        with self._cv:
            self.closed = True
            self._cv.notify_all()

    def queued(self) -> list[Job]:
        """The jobs waiting, in the order they will run (a snapshot)."""
        with self._cv:
            return list(self._jobs)

    def texts(self) -> int:
        """Text jobs waiting."""
        with self._cv:
            return sum(j.kind == "text" for j in self._jobs)

    def pending(self) -> int:
        with self._cv:
            return len(self._jobs) + (self.current is not None)

    def idle(self) -> bool:
        return self.pending() == 0

    def wait_idle(self, timeout: float) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: not self._jobs and self.current is None, timeout)


def _sent_before(job: Job, other: Job) -> bool:
    return job.stamp is not None and other.stamp is not None and job.stamp.before(other.stamp)
