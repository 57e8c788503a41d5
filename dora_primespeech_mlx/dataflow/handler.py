"""The node's logic without dora: inputs in, outputs out through a transport (``send(id, array, metadata)``).

:class:`MessageHandler` composes the parts, each a module of its own: the work queue and the one-answer gate
(:mod:`.jobs`), send order (:mod:`.order`), text intake with the LLM filter and the assembly of streamed
utterances (:mod:`.intake`, :mod:`.utterance`, :mod:`.sentences`), voices (:mod:`.voices`), the playback clock
(:mod:`.clock`) and the control answers (:mod:`.controls`). Threads: the input thread (``on_input``, never
blocks on the engine or the LLM stage), the intake thread, the worker (engine) and a supervisor.

Promises (tested with a fake engine and a fake transport, and under a real ``dora run``):

- **Exactly one ``segment_complete`` per ``text``** without ``segment_id``, and **one per utterance** (the
  fragments of one ``session_id``/``segment_id``; the fragments themselves get none), in the order they are
  spoken: ``completed``, ``skipped`` (nothing to speak, or phones of punctuation only) or ``error`` (bad input,
  unknown voice, synthesis failure, queue full, cancelled by ``reset``, a barge-in or STOP, an internal error).
  Every answer claims its job or utterance first, so no path answers twice; a supervisor replaces a dead worker
  within a second, answering the text it held.
- **Control is prompt**: ``stats`` and ``list_voices`` are answered from the input thread at once; ``cleanup``
  runs on the worker before the next queued job.
- **Send order across inputs** (:mod:`.order`): ``reset`` cancels exactly the texts sent before it (the one
  being spoken stops at the engine's next checkpoint); ``change_voice`` takes its place among the texts.
- **Barge-in**: a message with ``flush: true`` (on ``text`` or ``control``) cancels every text and utterance
  sent before it (the audio being made stops at the engine's next checkpoint, no chunk of it goes out after the
  flush), and the next ``audio`` the node sends carries ``flush: true``.
- **Bounded**: at most ``MAX_QUEUED_TEXTS`` texts (sentences of utterances included) wait; one more is
  answered at once with ``error`` (busy).
"""

from __future__ import annotations

import atexit
import json
import math
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import (
    ConfigError,
    NothingToSpeakError,
    PrimeSpeechError,
    SynthesisCancelled,
    SynthesisError,
    VoiceNotFoundError,
    VoiceNotInstalledError,
)
from ..settings import LOG_LEVELS, Settings
from ..text import llm
from . import cancellation, controls
from .cancellation import CANCEL_STAGES, CANCELLED, FLUSHED, STOPPING
from .clock import PlaybackClock
from .intake import Intake, check_once, parse_request
from .jobs import Job, JobQueue, QueueFull
from .messages import (
    ERROR_MAX_CHARS,
    InputError,
    TextRequest,
    clip,
    decode_text_value,
    normalize_segment_index,
    parse_control,
    sanitize_metadata,
)
from .order import TIMESTAMP_KEY, Stamp, stamp
from .utterance import Fragment, Utterance, convention, without_convention
from .voices import Voices

NODE_NAME = "primespeech"
WATCH_S = 0.5  # the supervisor looks at the worker this often
SEND_TRIES = 3
SILENCE_S = 0.05  # the silent audio answering a skipped or failed text (SILENCE_ON_SKIP)
SAMPLE_RATE = 32000  # of that silence when no voice is loaded yet (the models' rate)
EXIT_WAIT_S = 5.0  # at interpreter exit, how long the worker may take to reach a cancellation point and park

EngineFactory = Callable[[Callable[[str], None]], tuple[Any, Any]]  # progress -> (engine, start VoiceSpec)


class MessageHandler:
    """Turns dora inputs into outputs. ``on_input`` runs on the input thread and never blocks on the engine; a
    worker thread builds the engine (``engine_factory``) and runs the queued jobs."""

    def __init__(self, settings: Settings, engine_factory: EngineFactory, transport):
        self.settings = settings
        self._factory = engine_factory
        self.transport = transport
        self.jobs = JobQueue(settings.max_queued_texts)
        self.voices = Voices(settings)
        self.clock = PlaybackClock()
        self._seq = 0
        self._arrivals = 0  # inputs received (the order fallback)
        self.marks = cancellation.Marks()  # the latest reset and barge-in: texts sent before them are cancelled
        self._flush_next = False  # the next audio carries flush: true
        self._lock = threading.Lock()  # counts, the flush flag
        self._answer_lock = threading.RLock()  # segment_complete answers, in input order
        self.engine: Any = None
        self.ready = threading.Event()
        self.startup_error: BaseException | None = None
        self.counts = {"texts": 0, "completed": 0, "skipped": 0, "errors": 0, "cancelled": 0, "busy": 0,
                       "worker_restarts": 0, "utterances": 0, "sentences": 0}
        self._stopping = threading.Event()
        self._serving = threading.Event()  # set while a worker runs jobs; cleared when it ends or dies
        self.parked = threading.Event()  # the worker has finished for good (the process may exit now)
        self._warned_rate = False
        self._warned_index = False
        # PRIMESPEECH_LLM_TEXT: one LLM stream filter per session and question (text/llm.py), fed by the intake
        self.llm = llm.Sessions() if settings.llm_text else None
        self.intake = Intake(self._parse_job, self._admit, self._admit_sentence, self._utterance_closed, self.log,
                             llm_text=settings.llm_text, idle_s=settings.segment_idle_s)

    @property
    def voice(self):
        """The current voice (VoiceSpec)."""
        return self.voices.current

    @voice.setter
    def voice(self, spec) -> None:
        self.voices.current = spec

    # -- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> None:
        self.intake.start()
        self._spawn_worker(first=True)
        threading.Thread(target=self._supervise, name="primespeech-supervisor", daemon=True).start()
        atexit.register(self._park_at_exit)

    def _park_at_exit(self) -> None:
        """At interpreter exit, before daemon threads are stopped: let the worker park (a thread that used MLX
        and wakes during finalization aborts the process, exit code 134). The text it speaks is cancelled (and
        answered as stopping, if the transport still sends); queued jobs are left."""
        if self.parked.is_set() or not self._serving.is_set():
            return
        self._stopping.set()
        self.jobs.close()
        current = self.jobs.current
        if current is not None and not current.answered:
            current.error, current.error_stage = STOPPING, "stop"
            current.cancel.set()
        self.parked.wait(EXIT_WAIT_S)

    def _spawn_worker(self, first: bool = False) -> None:
        self._serving.set()
        threading.Thread(target=self._worker_main, args=(first,), name="primespeech-worker", daemon=True).start()

    def idle(self) -> bool:
        return self.ready.is_set() and self.intake.pending() == 0 and self.jobs.idle()

    def wait_idle(self, timeout: float) -> bool:
        """Whether the intake and the work queue became empty within ``timeout`` seconds (an open utterance
        waiting for its next fragment is no work: it ends at its ``fin``, its idle wait, or :meth:`finish`)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if self.intake.pending() == 0 and self.jobs.wait_idle(max(0.0, min(left, 0.05))) \
                    and self.intake.pending() == 0:
                return True
            if left <= 0:
                return False
            if self.intake.pending():
                time.sleep(min(0.01, max(left, 0.0)))

    def finish(self, stall_s: float = 300.0) -> bool:
        """Speak what is queued (open utterances end as if their ``fin`` had come), then stop the worker;
        returns False if no job finished for ``stall_s``."""
        self.intake.close_all()
        self.jobs.close()
        last, since = self.jobs.pending(), time.monotonic()
        while not self.jobs.wait_idle(WATCH_S):
            now = self.jobs.pending()
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since > stall_s:
                self.stop()
                return False
        self._stopping.set()
        self.intake.stop()
        return True

    def stop(self) -> int:
        """STOP: answer the text in flight and every queued job as cancelled, without waiting for the engine."""
        self._stopping.set()
        self.jobs.close()
        n = self._cancel_texts(STOPPING, "stop")
        self.intake.stop()
        self.jobs.take(("control",))
        return n

    # -- outputs --------------------------------------------------------------------------------------
    def send(self, output: str, array: pa.Array, metadata: dict) -> None:
        self.transport.send(output, array, metadata)

    def log(self, level: str, message: str) -> None:
        if LOG_LEVELS.index(level) < LOG_LEVELS.index(self.settings.log_level):
            return
        print(f"[{NODE_NAME}] {level} {message}", file=sys.stderr, flush=True)
        record = {"node": NODE_NAME, "level": level, "message": message, "timestamp": int(time.time())}
        try:
            self.send("log", pa.array([json.dumps(record, ensure_ascii=False)]), {"node": NODE_NAME, "level": level})
        except Exception as exc:  # a failing log output must not take a request down with it
            print(f"[{NODE_NAME}] ERROR cannot send log: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)

    def status(self, status: str, metadata: dict | None = None, level: str = "INFO", message: str = "",
               **fields) -> None:
        body = {"status": status, "node": NODE_NAME, "level": level, "message": message or status,
                "timestamp": int(time.time()), **fields}
        self.send("status", pa.array([json.dumps(body, ensure_ascii=False, default=str)]), dict(metadata or {}))

    def _next_seq(self) -> int:
        """The next text number (texts on the input thread, sentences on the intake thread)."""
        with self._lock:
            self._seq += 1
            return self._seq

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

    def _complete(self, job: Job, outcome: str, before: Callable[[], None] | None = None) -> bool:
        """Claim the job, then send what goes with its answer (``before``: silence, a status) and its one
        ``segment_complete`` (a sentence's outcome goes to its utterance instead); False (and nothing sent) if it
        was answered already. Answers are sent under one lock, so a reset on the input thread never overtakes the
        worker's answer to an earlier text."""
        with self._answer_lock:
            if not job.claim():
                return False
            if before is not None:
                try:
                    before()
                except Exception as exc:  # the answer itself goes out whatever happened to what precedes it
                    self.log("ERROR", f"text #{job.seq}: {type(exc).__name__}: {exc}")
            if job.utterance is not None:
                self._part_done(job, outcome)
            else:
                self._send_complete(job, outcome)
            return True

    def _send_complete(self, job: Job, outcome: str, error: str | None = None, stage: str | None = None) -> None:
        self._send_answer(job.metadata, outcome, error, stage, f"text #{job.seq}")

    def _send_answer(self, metadata: dict, outcome: str, error: str | None, stage: str | None, what: str) -> None:
        md = dict(metadata)
        if outcome == "error":
            md.update(session_status="error", error=error or "error", error_stage=stage or "synthesis")
        self._count("errors" if outcome == "error" else outcome)
        for attempt in range(SEND_TRIES):
            try:
                self.send("segment_complete", pa.array([outcome]), md)
                return
            except Exception as exc:
                print(f"[{NODE_NAME}] ERROR segment_complete of {what} not sent (try {attempt + 1}): "
                      f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)

    def _silence(self, job: Job | None, utterance: Utterance | None = None, always: bool = False) -> None:
        """SILENCE_ON_SKIP: one short silent ``audio`` message for a text (or an utterance) that produced no
        audio (sent by the caller that claimed it); ``always``: also without SILENCE_ON_SKIP (the ``fin`` chunk
        that closes an utterance whose last audio went out before its end was known)."""
        if not (self.settings.silence_on_skip or always):
            return
        voice = self.voice
        rate = SAMPLE_RATE
        if utterance is not None:
            md = {**utterance.metadata, **utterance.chunk_metadata(True, None)}
        else:
            md = without_convention(job.metadata)
        md.update(sample_rate=rate, duration=SILENCE_S, voice=str(getattr(voice, "name", "")),
                  language=str(getattr(voice, "language", "")), chunk_index=0, fragment_num=1, is_final=True,
                  is_streaming=bool(self.settings.streaming), silent=True)
        audio = np.zeros(int(rate * SILENCE_S), dtype=np.float32)
        try:
            self._emit_audio(audio, md)
        except Exception as exc:
            what = f"text #{job.seq}" if job is not None else f"segment {utterance.key[1]!r}"
            self.log("ERROR", f"silent audio for {what} not sent: {type(exc).__name__}: {exc}")

    def _emit_audio(self, audio: np.ndarray, md: dict) -> None:
        """Send one ``audio`` message; the first after a barge-in carries ``flush: true``."""
        with self._lock:
            if self._flush_next:
                md["flush"], self._flush_next = True, False
        array = pa.array(audio) if self.settings.audio_format == "flat" else pa.array([audio])
        self.send("audio", array, md)

    def _fail(self, job: Job, error: str, stage: str) -> bool:
        """Answer ``job`` with an error: claimed first, so a text gets one ``status: error`` and one
        ``segment_complete`` whoever else (worker, reset, STOP, supervisor) tries to answer it at the same time.
        A sentence of an utterance reports to its utterance; cancelled with it, it sends nothing (False)."""
        error = clip(error, ERROR_MAX_CHARS)
        with self._answer_lock:
            if not job.claim():
                return False
            if job.utterance is not None and stage in CANCEL_STAGES:
                return False
            if stage not in CANCEL_STAGES and job.utterance is None:
                self._silence(job)
            level = "WARNING" if stage in (*CANCEL_STAGES, "busy") else "ERROR"
            self.log(level, f"text #{job.seq} ({_describe(job.metadata)}): {stage} error: {error}")
            try:
                self.status("error", job.metadata, level=level, message=error, error=error, error_stage=stage,
                            seq=job.seq)
            except Exception as exc:
                self.log("ERROR", f"status for text #{job.seq} not sent: {type(exc).__name__}: {exc}")
            if job.utterance is not None:
                self._part_done(job, "error", error, stage)
            else:
                self._send_complete(job, "error", error, stage)
            return True

    # -- utterances -----------------------------------------------------------------------------------
    def _part_done(self, job: Job, outcome: str, error: str | None = None, stage: str | None = None) -> None:
        if job.utterance.part_done(outcome, error, stage):
            self._answer_utterance(job.utterance)

    def _utterance_closed(self, utterance: Utterance) -> None:
        """Intake: ``utterance`` takes no more sentences; answered here if all of them are."""
        if utterance.complete:
            self._answer_utterance(utterance)

    def _answer_utterance(self, utterance: Utterance, cancelled: tuple[str, str] | None = None) -> bool:
        """The one ``segment_complete`` of an utterance (its metadata: the first fragment's), after a ``fin``
        audio chunk if its last audio went out before its end was known, or its silence if nothing was spoken.
        ``cancelled``: (reason, stage) of a reset, barge-in or STOP."""
        with self._answer_lock:
            if not utterance.claim():
                return False
            self._count("texts")
            self._count("utterances")
            if cancelled is not None:
                self._send_answer(utterance.metadata, "error", cancelled[0], cancelled[1], _what(utterance))
                return True
            outcome, error, stage = utterance.outcome()
            try:
                if outcome != "completed":
                    self._silence(None, utterance)
                elif not utterance.fin_sent:
                    self._silence(None, utterance, always=True)
            except Exception as exc:  # the answer goes out whatever happened before it
                self.log("ERROR", f"{_what(utterance)}: {type(exc).__name__}: {exc}")
            self._send_answer(utterance.metadata, outcome, error, stage, _what(utterance))
            return True

    # -- input thread ---------------------------------------------------------------------------------
    def on_input(self, input_id: str, value: Any, metadata: Any) -> None:
        """Handle one INPUT event. Never raises; every text is answered."""
        try:
            self._arrivals += 1
            st = stamp(metadata, self._arrivals)
            if input_id == "text":
                self._on_text(value, metadata, st)
            elif input_id == "control":
                self._on_control(value, _metadata(metadata), st)
            elif input_id == "reset":
                self._reset(_metadata(metadata), st)
            else:
                self.log("DEBUG", f"ignoring input {input_id!r} (this node reads text, control and reset)")
        except Exception as exc:  # keep serving whatever happens
            self.log("ERROR", f"input {input_id!r} failed: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")

    def _on_text(self, value: Any, metadata: Any, st: Stamp | None = None) -> None:
        problems: list[str] = []
        md = _metadata(metadata, problems)
        if problems:
            self.log("WARNING", f"text (arrival {self._arrivals}): metadata not echoed as sent: "
                                f"{'; '.join(problems)[:1000]}")
        if not normalize_segment_index(md) and not self._warned_index:
            self._warned_index = True
            self.log("WARNING", f"segment_index {md['segment_index']!r} is not a number: passed on unchanged "
                                "(players compute segment_index + 1)")
        md.setdefault("question_id", "default")
        md.setdefault("session_status", "unknown")
        segment_id, fragment_seq, fin, flush = convention(md)
        key = None if segment_id is None else (str(md.get("session_id", "default")), str(segment_id))
        if key is not None and st is not None:  # a fragment's seq numbers it within its segment, not among inputs
            st = Stamp(st.time, None, st.arrival)
        if flush and not self._stopping.is_set():
            self._barge_in(md, st, key)
        if key is not None:
            self._on_fragment(value, md, st, key, Fragment("", fragment_seq, fin))
            return
        job = Job("text", md, seq=self._next_seq(), stamp=st)
        try:
            job.raw = decode_text_value(value)
        except InputError as exc:
            job.error = str(exc)
        except Exception as exc:  # anything a hostile payload provokes
            job.error = f"unreadable text: {type(exc).__name__}"
        if self._stopping.is_set():
            self._count("texts")
            self._fail(job, STOPPING, "stop")
            return
        cancelled = self.marks.cancelled(st)
        if cancelled is not None:
            self._count("texts")
            with self._answer_lock:
                if self._fail(job, *cancelled):
                    self._count("cancelled")
            return
        if self.jobs.texts() + self.intake.queued_texts() >= self.jobs.max_texts:  # answered at once, not later
            self._count("texts")
            self._count("busy")
            self._fail(job, f"busy: {self.jobs.max_texts} texts are already waiting (MAX_QUEUED_TEXTS)", "busy")
            return
        self.intake.put_text(job, job.raw or "")

    def _on_fragment(self, value: Any, md: dict, st: Stamp | None, key: tuple[str, str], fragment: Fragment) -> None:
        """A fragment of a streamed utterance: to the intake (answered with its utterance, never alone). A fragment
        sent before a reset or barge-in that arrives after it, or of a cancelled utterance, is dropped."""
        if self._stopping.is_set() or self.marks.cancelled(st) is not None or self.intake.forgotten(key):
            self.log("DEBUG", f"fragment of session {key[0]!r} segment {key[1]!r} dropped (cancelled)")
            return
        try:
            fragment.text = decode_text_value(value)
        except Exception as exc:  # noqa: BLE001 - a bad fragment is left out; its utterance goes on
            self.log("WARNING", f"fragment of session {key[0]!r} segment {key[1]!r} left out: "
                                f"{type(exc).__name__}: {exc}")
        self.intake.put_fragment(key, without_convention(md), st, fragment)

    def _parse_job(self, job: Job, raw: str) -> None:
        """Intake: a plain text's request (LLM-cleaned), or its error."""
        parse_request(job, raw, self.llm, self.settings.max_text_chars, self.log)

    def _admit_sentence(self, utterance: Utterance, sentence: str) -> None:
        """Intake: one complete sentence of ``utterance``, queued as a text of its own."""
        self._count("sentences")
        job = Job("text", dict(utterance.metadata), seq=self._next_seq(), stamp=utterance.stamp, utterance=utterance,
                  part=utterance.sentences - 1, request=TextRequest(text=sentence, overrides={"llm_text": False}))
        self._admit(job)

    def _admit(self, job: Job) -> None:
        """Intake: check a text once (something to speak, within MAX_TEXT_CHARS) and queue it (a control job as
        it is)."""
        if job.kind == "control":
            self.jobs.put(job)
            return
        if job.utterance is None:
            self._count("texts")
        check_once(job, self.settings.max_text_chars)
        if self._stopping.is_set():
            self._fail(job, STOPPING, "stop")
            return
        try:
            self.jobs.put(job)
        except QueueFull as exc:
            self._count("busy")
            self._fail(job, str(exc), "busy")

    def _on_control(self, value: Any, md: dict, st: Stamp | None = None) -> None:
        if convention(md)[3]:  # flush: true on a control: a barge-in, then the command (if any)
            if not self._stopping.is_set():
                self._barge_in(md, st, None)
            try:
                if not decode_text_value(value).strip():
                    return
            except Exception:  # noqa: BLE001 - parse_control reports it below
                pass
        try:
            command = parse_control(decode_text_value(value))
        except Exception as exc:
            self.log("ERROR", str(exc))
            self.status("error", md, level="ERROR", message=str(exc), error=str(exc), command="unknown")
            return
        if command.name == "reset":
            self._reset(md, st)
        elif command.name == "change_voice":  # through the intake: behind the texts that arrived before it
            self.intake.put_control(Job("control", md, command=command, stamp=st))
        elif not self.ready.is_set() or self.engine is None:
            self.status("error", md, level="ERROR", message="not ready", error="not ready", command=command.name)
        elif command.name == "cleanup":  # on the worker, between two jobs: never stalls a text's audio
            self.jobs.put(Job("control", md, command=command), front=True)
        else:
            self._run_control(command, md)

    def _reset(self, md: dict, st: Stamp | None = None) -> None:
        if self.llm is not None:
            self.llm.reset()  # open reasoning/code blocks are forgotten with the texts
        self.marks.note("reset", st)
        n = self._cancel_texts(CANCELLED, "reset", st)
        self.clock.forget()  # a player may drop what it holds on a reset: the next text plans without it
        self.log("INFO", f"reset: {n} text(s) cancelled")
        self.status("reset", md, message=f"reset: {n} text(s) cancelled", cancelled=n)

    def _barge_in(self, md: dict, st: Stamp | None, keep: tuple[str, str] | None) -> None:
        """``flush: true``: cancel every text and utterance sent before this message (but the utterance it starts
        or continues, ``keep``); the next audio carries ``flush: true`` so dora empties the player's queue."""
        self.marks.note("flush", st)
        n = self._cancel_texts(FLUSHED, "flush", st, keep)
        if self.llm is not None:
            self.llm.reset()  # the plain texts' open reasoning/code blocks go with them (utterances have their own)
        with self._lock:
            self._flush_next = True
        self.clock.forget()
        self.log("INFO", f"flush: {n} text(s) cancelled")
        self.status("flush", without_convention(md), message=f"flush: {n} text(s) cancelled", cancelled=n)

    def _cancel_texts(self, reason: str, stage: str, before: Stamp | None = None,
                      keep: tuple[str, str] | None = None) -> int:
        """Cancel the texts and utterances sent before ``before`` (all when None) but the utterance ``keep``
        (:func:`.cancellation.collect`); each text and utterance counts (and is answered) once."""
        with self.intake.hold(), self._answer_lock:
            waiting, queued, utterances = cancellation.collect(self.intake, self.jobs, reason, stage, before, keep)
            self._count("texts", len(waiting))  # counted when admitted, which these never were
            n = sum(self._fail(job, reason, stage) for job in [*queued, *waiting])  # in flight first
            n += sum(self._answer_utterance(u, (reason, stage)) for u in utterances)
            self._count("cancelled", n)
            return n

    # -- worker and supervisor ------------------------------------------------------------------------
    def _worker_main(self, first: bool) -> None:
        try:
            if first:
                try:
                    self.engine, self.voice = self._factory(lambda m: self.log("INFO", m))
                except BaseException as exc:
                    self.startup_error = exc
                    return
                finally:
                    self.ready.set()
            while not self._stopping.is_set():
                job = self.jobs.get(WATCH_S)
                if job is None:
                    if self.jobs.closed:
                        break
                    continue
                try:
                    self._run_job(job)
                finally:
                    self.jobs.done()
        finally:
            self._serving.clear()
            if self.jobs.closed or self._stopping.is_set():
                self.parked.set()
            # Never let this thread end: a thread that used MLX aborts the process in its thread-local
            # teardown ("terminate called without an active exception", MLX 0.32 on Linux), so it parks
            # (a daemon thread) and the process exits around it.
            threading.Event().wait()

    def _run_job(self, job: Job) -> None:
        try:
            if job.kind == "text":
                self._run_text(job)
            elif job.command.name == "change_voice":
                self._change_voice(job.command.arg, job.metadata, job.stamp)
            else:
                self._run_control(job.command, job.metadata)
        except BaseException as exc:  # answer it, whatever it was, and go on
            try:
                self.log("ERROR", f"internal error: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            finally:
                if job.kind == "text":
                    self._fail(job, f"internal error: {type(exc).__name__}: {exc}", "node")
            if not isinstance(exc, Exception):
                raise

    def _supervise(self) -> None:
        """Replace a worker that died (it parks instead of exiting: see ``_worker_main``), answering its job."""
        self.ready.wait()
        while not self._stopping.wait(WATCH_S):
            if self.startup_error is not None or self._serving.is_set() or self.jobs.closed:
                continue
            current = self.jobs.current
            if current is not None and current.kind == "text":
                self._fail(current, "internal error: the worker thread died", "node")
            self.jobs.done()
            self._count("worker_restarts")
            self.log("ERROR", "the worker thread died; starting a new one")
            self._spawn_worker()

    # -- texts ----------------------------------------------------------------------------------------
    def _run_text(self, job: Job) -> None:
        if job.answered:
            return
        if job.error is not None:
            self._fail(job, job.error, job.error_stage)
            return
        req = job.request
        for w in req.warnings:
            self.log("WARNING", f"text #{job.seq}: {w}")
        text = req.text
        if job.skip:
            self.log("DEBUG", f"text #{job.seq}: nothing to speak ({text[:40]!r}), skipped")
            self._skip(job)
            return
        try:
            voice = self._voice_of(job)
        except (VoiceNotFoundError, VoiceNotInstalledError, ConfigError) as exc:
            self._fail(job, str(exc), "voice")
            return
        language = req.overrides.get("text_lang") or voice.language
        where = {} if job.utterance is None else {"sentence": job.part}
        self.status("synthesizing", job.metadata, seq=job.seq, voice=voice.name, language=language,
                    characters=len(text), **where)
        t0 = time.perf_counter()
        try:
            duration, chunks, timings = self._synthesize(job, text, voice, language, req)
        except SynthesisCancelled:
            duration = chunks = 0
        except NothingToSpeakError as exc:
            self.log("DEBUG", f"text #{job.seq}: nothing to speak ({exc}), skipped")
            self._skip(job)
            return
        except SynthesisError as exc:
            stage = getattr(exc, "stage", "synthesis")
            self._fail(job, _request_voice_error(req, exc, stage) or str(exc), stage)
            return
        except (PrimeSpeechError, ValueError) as exc:  # text front end, bad request parameters
            self._fail(job, f"{exc}", "text" if type(exc).__module__.endswith("text.errors") else "request")
            return
        if job.cancel.is_set():
            self._fail(job, job.error or CANCELLED, job.error_stage if job.error else "reset")
            return
        elapsed = time.perf_counter() - t0
        if job.answered:  # a reset answered it while its last audio went out
            return
        if self.settings.log_timing:
            rtf = elapsed / duration if duration > 0 else math.inf
            detail = ", ".join(f"{k} {v:.2f}s" for k, v in (timings or {}).items() if isinstance(v, (int, float)))
            self.log("INFO", f"text #{job.seq}: {duration:.2f} s of audio in {elapsed:.2f} s (RTF {rtf:.2f}), "
                             f"{chunks} chunk(s), voice {voice.name}" + (f"; {detail}" if detail else ""))
        self._complete(job, "completed", lambda: self.status(
            "done", job.metadata, seq=job.seq, voice=voice.name, duration=round(duration, 3),
            elapsed=round(elapsed, 3), chunks=chunks, **where))

    def _skip(self, job: Job) -> None:
        self._complete(job, "skipped", None if job.utterance is not None else lambda: self._silence(job))

    def _synthesize(self, job: Job, text: str, voice, language: str, req: TextRequest):
        overrides = dict(req.overrides)
        total, n, timings = 0.0, 0, {}
        if self.settings.streaming:
            for chunk in self.engine.synthesize_stream(text, voice=voice, cancel=job.cancel, key=job.seq,
                                                       upcoming=self._upcoming, playing_until=self.clock.until,
                                                       **overrides):
                if job.cancel.is_set():
                    break
                total += self._send_audio(job, chunk.audio, chunk.sample_rate, voice, language,
                                          chunk.chunk_index, bool(chunk.is_final), True, req.volume)
                n += 1
            return total, n, timings
        result = self.engine.synthesize(text, voice=voice, cancel=job.cancel, **overrides)
        if job.cancel.is_set():
            return 0.0, 0, {}
        total = self._send_audio(job, result.audio, result.sample_rate, voice, language, 0, True, False, req.volume)
        return total, 1, dict(getattr(result, "timings", {}) or {})

    def _upcoming(self) -> list:
        """The texts queued right behind the one being spoken, as the worker will ask the engine for them (its
        continuous batching lets them join the running decode; engine/batching.py). Up to the first control job
        (a ``change_voice`` keeps its place); texts that will fail or be skipped are left out."""
        from ..engine.batching import Upcoming

        out = []
        for job in self.jobs.queued():
            if job.kind != "text":
                break
            req = job.request
            if job.answered or job.error is not None or job.skip or req is None or job.cancel.is_set():
                continue
            try:
                voice = self._voice_of(job)
            except Exception:  # noqa: BLE001 - its own turn reports it
                continue
            out.append(Upcoming(job.seq, req.text, voice, dict(req.overrides), job.cancel))
        return out

    def _send_audio(self, job: Job, audio, sample_rate: int, voice, language: str, index: int, final: bool,
                    streaming: bool, volume: float | None) -> float:
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        if not np.isfinite(audio).all():  # NaN/inf never leave the node: the text is answered with this error
            raise SynthesisError(f"voice {voice.name}: the synthesis produced non-finite samples (NaN or inf); "
                                 "nothing of this chunk was sent", stage="sovits")
        if volume is not None and volume != 1.0:
            audio = np.clip(audio * np.float32(volume), -1.0, 1.0).astype(np.float32)
        sample_rate = int(sample_rate)
        if self.settings.sample_rate and self.settings.sample_rate != sample_rate and not self._warned_rate:
            self._warned_rate = True
            self.log("WARNING", f"SAMPLE_RATE={self.settings.sample_rate} is informational; the model's "
                                f"rate is {sample_rate} Hz and metadata sample_rate says so")
        duration = len(audio) / sample_rate
        with job.answer_lock:  # never audio after the text's segment_complete (e.g. a reset answered it)
            if not job.answered:
                md = self._audio_metadata(job, final)
                md.update(sample_rate=sample_rate, duration=float(duration), voice=str(voice.name),
                          language=str(language), chunk_index=int(index), fragment_num=int(index) + 1,
                          is_final=bool(final), is_streaming=bool(streaming))
                self._emit_audio(audio, md)
                self.clock.sent(duration)
        return duration

    @staticmethod
    def _audio_metadata(job: Job, final: bool) -> dict:
        """The text's metadata for its audio: a plain text's without the convention's per-message keys (``seq``
        here means the chunk number); a sentence's: its utterance's with the chunk's ``seq`` and ``fin``."""
        if job.utterance is None:
            return without_convention(job.metadata)
        return {**job.utterance.metadata, **job.utterance.chunk_metadata(final, job.part)}

    def _voice_of(self, job: Job):
        """The voice ``job`` is spoken with, resolved once (a ``change_voice`` that runs clears it)."""
        if job.voice is None:
            job.voice = self.voices.for_request(job.request, job.stamp)
        return job.voice

    # -- control --------------------------------------------------------------------------------------
    def _run_control(self, cmd, md: dict) -> None:
        with self._lock:
            counts = dict(self.counts)
        controls.answer(cmd, md, self.engine, self.voice, counts, self.jobs.pending() + self.intake.queued_texts(),
                        self.status, self.log)

    def _change_voice(self, name: str, md: dict, st: Stamp | None = None) -> None:
        old = self.voice
        try:
            self.log("INFO", f"loading voice {name} ...")
            spec, old = self.voices.change(name, self.engine, st)
        except Exception as exc:  # any failure: the previous voice stays current
            error = clip(exc, ERROR_MAX_CHARS)
            self.log("ERROR", f"change_voice failed, keeping {old.name}: {error}")
            self.status("error", md, level="ERROR", message=error, error=error, command="change_voice",
                        voice=old.name)
            return
        for job in self.jobs.queued():
            job.voice = None  # resolved before this change: resolved again at its turn
        self.log("INFO", f"voice changed to {spec.name} ({spec.language})")
        self.status("voice_changed", md, voice=spec.name, language=spec.language, previous=old.name,
                    message=f"voice {spec.name}")


def _request_voice_error(req: TextRequest, exc: BaseException, stage: str) -> str | None:
    """For a voice built from a request's paths that fails to load: a message without the loader's details, which
    may quote the file (its first bytes, say). None for every other failure (reported as it is)."""
    if stage not in ("load", "reference") or req.voice is None or req.voice.kind not in ("custom", "trained"):
        return None
    cause = type(exc.__cause__).__name__ if exc.__cause__ is not None else type(exc).__name__
    return (f"VOICE:{req.voice.kind.upper()}: the files it names cannot be loaded as a voice ({cause}; the node's "
            "operator can run `primespeech-mlx convert` on them to see why)")


def _metadata(metadata: Any, problems: list[str] | None = None) -> dict:
    """The input's metadata as the node echoes it on its outputs, without dora's send ``timestamp``: dora keeps a
    sender's own ``timestamp`` key instead of stamping the send time, so an echoed one would make every output
    (and any text a client sends with metadata copied from it) look sent when the input was."""
    try:
        md = sanitize_metadata(metadata, problems)
    except Exception as exc:
        if problems is not None:
            problems.append(f"unreadable ({type(exc).__name__}): dropped")
        return {}
    md.pop(TIMESTAMP_KEY, None)
    return md


def _what(utterance: Utterance) -> str:
    return f"session {utterance.key[0]!r} segment {utterance.key[1]!r}"


def _describe(md: dict) -> str:
    keys = ("question_id", "session_id", "segment_index")
    return ", ".join(f"{k}={md[k]}" for k in keys if k in md) or "no ids"
