"""From the intake to the work queue: each text (a plain one, or a sentence of an utterance) is numbered, parsed
(plain texts, with the LLM filter), checked once (:func:`check_once`) and queued, or answered at once when
the node is stopping or the queue is full (``MAX_QUEUED_TEXTS``). Runs on the intake thread; numbering and
:meth:`Admission.refused` (a plain text answered on arrival) also on the input thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..text import llm
from ..text.speakable import has_speakable
from .answers import Answers
from .cancellation import STOPPING
from .jobs import Job, JobQueue, QueueFull
from .messages import InputError, TextRequest, parse_text
from .streams import Filters
from .utterance import Utterance


class Admission:
    """``answers.out.settings`` gives MAX_TEXT_CHARS (read at each text); ``sessions``: the plain texts' LLM
    filters (None without PRIMESPEECH_LLM_TEXT); ``stopping``: set once the node stops."""

    def __init__(self, jobs: JobQueue, answers: Answers, sessions, stopping: threading.Event):
        self.jobs, self.answers, self.out = jobs, answers, answers.out
        self.sessions = sessions
        self.stopping = stopping
        self._seq = 0
        self._lock = threading.Lock()

    def next_seq(self) -> int:
        """The next text number (texts on the input thread, sentences on the intake thread)."""
        with self._lock:
            self._seq += 1
            return self._seq

    def refused(self, job: Job, cancelled: tuple[str, str] | None, waiting: int, room: bool = True) -> bool:
        """On the input thread, before the intake: answer a plain text at once (True) when the node is stopping,
        when a reset or barge-in sent after it came first (``cancelled``: its reason and stage), when the
        queue and the ``waiting`` texts of the intake fill MAX_QUEUED_TEXTS, or when its characters find no
        ``room`` in the intake (PRIMESPEECH_MAX_INTAKE_CHARS); False: it goes on to the intake."""
        if self.stopping.is_set():
            self.out.counts.add("texts")
            self.answers.fail(job, STOPPING, "stop")
            return True
        if cancelled is not None:
            self.out.counts.add("texts")
            with self.answers.lock:
                if self.answers.fail(job, *cancelled):
                    self.out.counts.add("cancelled")
            return True
        if not room:
            self.out.counts.add("texts")
            self.out.counts.add("busy")
            limit = self.out.settings.max_intake_chars
            self.answers.fail(job, f"busy: the intake holds {limit} characters of texts waiting "
                                   "(PRIMESPEECH_MAX_INTAKE_CHARS)", "busy")
            return True
        if self.jobs.texts() + waiting >= self.jobs.max_texts:  # answered at once, not later
            self.out.counts.add("texts")
            self.out.counts.add("busy")
            self.answers.fail(job, f"busy: {self.jobs.max_texts} texts are already waiting (MAX_QUEUED_TEXTS)",
                              "busy")
            return True
        return False

    def parse(self, job: Job, raw: str) -> None:
        """A plain text's request (LLM-cleaned), or its error."""
        parse_request(job, raw, self.sessions, self.out.settings.max_text_chars, self.out.log)

    def sentence(self, utterance: Utterance, sentence: str) -> None:
        """One complete sentence of ``utterance``, queued as a text of its own."""
        self.out.counts.add("sentences")
        job = Job("text", dict(utterance.metadata), seq=self.next_seq(), stamp=utterance.stamp, utterance=utterance,
                  part=utterance.sentences - 1, request=TextRequest(text=sentence))
        self.admit(job)

    def admit(self, job: Job) -> None:
        """Check a text once (something to speak, within MAX_TEXT_CHARS) and queue it (a control job as it is)."""
        if job.kind == "control":
            self.jobs.put(job)
            return
        if job.utterance is None:
            self.out.counts.add("texts")
        check_once(job, self.out.settings.max_text_chars)
        if self.stopping.is_set():
            self.answers.fail(job, STOPPING, "stop")
            return
        try:
            self.jobs.put(job)
        except QueueFull as exc:
            self.out.counts.add("busy")
            self.answers.fail(job, str(exc), "busy")


def parse_request(job: Any, raw: str, sessions: Filters | None, max_chars: int,
                  log: Callable[[str, str], None]) -> None:
    """Fill a plain text job's request from ``raw`` (JSON payload, voice prefix), its text what the session's LLM
    filter leaves of it (``sessions``; None: raw), or its error."""
    try:
        job.request = _request(raw, job.metadata, sessions, max_chars, log)
    except InputError as exc:
        job.error = str(exc)
    except Exception as exc:  # anything a hostile payload provokes (RecursionError from deep JSON, ...)
        job.error = f"unreadable text: {type(exc).__name__}"


def _request(raw: str, md: dict, sessions: Filters | None, max_chars: int,
             log: Callable[[str, str], None]) -> TextRequest:
    """With the LLM stage: reasoning, tool calls and code spanning messages dropped ("" makes it a skipped text)."""
    if sessions is None or len(raw) > max_chars:  # too long: refused with an error anyway
        return parse_text(raw)
    stream = sessions.get(md.get("session_id", "default"), md.get("question_id"))
    try:
        req = parse_text(raw)
    except InputError:
        if stream.in_block is None:
            raise
        req = TextRequest(text=raw)  # a tool call's JSON arguments, a line of code: part of the open block
    overflows = stream.overflows
    req.text = stream.feed(req.text)
    if stream.overflows != overflows:
        ids = ", ".join(f"{k}={md[k]}" for k in ("question_id", "session_id") if k in md) or "no ids"
        log("WARNING", f"a reasoning/tool-call/code block open for {llm.MAX_BLOCK_MESSAGES} messages or "
                       f"{llm.MAX_BLOCK_CHARS} characters was closed ({ids})")
    return req  # (the engine does not clean it again: speech.engine_overrides)


def check_once(job: Any, max_chars: int) -> None:
    """The checks every text passes once, when it is admitted: more than ``max_chars`` (MAX_TEXT_CHARS) an input
    error (checked first: no work is spent on a text that is refused), nothing to speak makes it skipped."""
    req = job.request
    if job.error is not None or req is None:
        return
    if len(req.text) > max_chars:
        job.error, job.error_stage = (f"text too long: {len(req.text)} characters (MAX_TEXT_CHARS={max_chars})",
                                      "input")
    elif not has_speakable(req.text):
        job.skip = True
