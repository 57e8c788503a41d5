"""The node's logic without dora: inputs in, outputs out through a transport (``send(id, array, metadata)``).

Promises (tested with a fake engine and a fake transport, and under a real ``dora run``):

- **Exactly one ``segment_complete`` per ``text``**, in the order the texts are spoken (a text that arrives
  after a reset sent later than it is answered at once): ``completed``, ``skipped`` (nothing to speak, or
  phones of punctuation only: text its language cannot read) or ``error`` (bad input, unknown voice, synthesis
  failure, queue full, cancelled by ``reset`` or by STOP, or an internal error). Every answer claims the job
  (:meth:`Job.claim`) before anything of it is sent, so no path answers twice; any exception
  while running or answering a job is logged and answered, and a supervisor thread replaces a dead worker
  within a second, answering the text it held.
- **Control is prompt**: ``stats`` and ``list_voices`` are answered from the input thread at once, also with a
  long text backlog and while the worker is busy (nothing the worker runs holds the GIL for long);
  ``cleanup`` runs on the worker before the next queued job (never in the middle of a text's audio).
- **Send order across inputs** (:mod:`.order`): dora does not keep it between ``text`` and ``control`` under a
  backlog, so every input is stamped with its send time (dora's metadata ``timestamp``, then the sender's
  ``seq``, then arrival). ``reset`` cancels exactly the texts sent before it — the one being spoken (the
  engine and the text front end stop at their next checkpoint), the queued ones, and any that arrive later —
  never one sent after it; ``change_voice`` takes its place among the texts by send order (texts sent before
  it speak with the old voice, texts sent after it with the new one).
- **Bounded**: at most ``MAX_QUEUED_TEXTS`` texts wait; one more is answered at once with ``error`` (busy).
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
from ..paths import request_roots
from ..settings import LOG_LEVELS, Settings
from ..text import llm
from ..text.speakable import has_speakable
from .jobs import Job, JobQueue, QueueFull
from .messages import (
    ERROR_MAX_CHARS,
    InputError,
    TextRequest,
    clip,
    decode_text_value,
    normalize_segment_index,
    parse_control,
    parse_text,
    sanitize_metadata,
)
from .order import TIMESTAMP_KEY, Stamp, stamp

NODE_NAME = "primespeech"
CANCELLED = "cancelled by reset"
STOPPING = "cancelled: the node is stopping"
WATCH_S = 0.5  # the supervisor looks at the worker this often
SEND_TRIES = 3
SILENCE_S = 0.05  # the silent audio answering a skipped or failed text (SILENCE_ON_SKIP)
SAMPLE_RATE = 32000  # of that silence when no voice is loaded yet (the models' rate)
EXIT_WAIT_S = 5.0  # at interpreter exit, how long the worker may take to reach a cancellation point and park
VOICE_LOG = 16  # voice changes remembered for texts that arrive after a change_voice sent later than them

EngineFactory = Callable[[Callable[[str], None]], tuple[Any, Any]]  # progress -> (engine, start VoiceSpec)


class MessageHandler:
    """Turns dora inputs into outputs. ``on_input`` runs on the input thread and never blocks on the engine; a
    worker thread builds the engine (``engine_factory``) and runs the queued jobs."""

    def __init__(self, settings: Settings, engine_factory: EngineFactory, transport):
        self.settings = settings
        self._factory = engine_factory
        self.transport = transport
        self.jobs = JobQueue(settings.max_queued_texts)
        self._seq = 0
        self._arrivals = 0  # inputs received (the order fallback)
        self._reset_mark: Stamp | None = None  # the latest reset: texts sent before it are cancelled on arrival
        self._voice_log: list[tuple[Stamp | None, Any]] = []  # (change_voice's stamp, the voice before it)
        self._lock = threading.Lock()  # counts
        self._answer_lock = threading.RLock()  # segment_complete answers, in input order
        self.engine: Any = None
        self.voice: Any = None  # current VoiceSpec
        self.ready = threading.Event()
        self.startup_error: BaseException | None = None
        self.counts = {"texts": 0, "completed": 0, "skipped": 0, "errors": 0, "cancelled": 0, "busy": 0,
                       "worker_restarts": 0}
        self._stopping = threading.Event()
        self._serving = threading.Event()  # set while a worker runs jobs; cleared when it ends or dies
        self.parked = threading.Event()  # the worker has finished for good (the process may exit now)
        self._warned_rate = False
        # when the audio sent so far will have played (time.perf_counter), for a player that starts each chunk on
        # arrival or when the one before it ends: a stream plans its first pieces with that audio in hand
        self._playing_until: float | None = None
        self._warned_index = False
        # PRIMESPEECH_LLM_TEXT: one LLM stream filter per session and question (text/llm.py), fed on the input thread
        self.llm = llm.Sessions() if settings.llm_text else None

    # -- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> None:
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
        return self.ready.is_set() and self.jobs.idle()

    def wait_idle(self, timeout: float) -> bool:
        return self.jobs.wait_idle(timeout)

    def finish(self, stall_s: float = 300.0) -> bool:
        """Speak what is queued, then stop the worker; returns False if no job finished for ``stall_s``."""
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
        return True

    def stop(self) -> int:
        """STOP: answer the text in flight and every queued job as cancelled, without waiting for the engine."""
        self._stopping.set()
        self.jobs.close()
        n = self._cancel_texts(STOPPING, "stop")
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

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

    def _complete(self, job: Job, outcome: str, before: Callable[[], None] | None = None) -> bool:
        """Claim the job, then send what goes with its answer (``before``: silence, a status) and its one
        ``segment_complete``; False (and nothing sent) if it was answered already. Answers are sent under one
        lock, so a reset on the input thread never overtakes the worker's answer to an earlier text."""
        with self._answer_lock:
            if not job.claim():
                return False
            if before is not None:
                try:
                    before()
                except Exception as exc:  # the answer itself goes out whatever happened to what precedes it
                    self.log("ERROR", f"text #{job.seq}: {type(exc).__name__}: {exc}")
            self._send_complete(job, outcome)
            return True

    def _send_complete(self, job: Job, outcome: str, error: str | None = None, stage: str | None = None) -> None:
        md = dict(job.metadata)
        if outcome == "error":
            md.update(session_status="error", error=error or "error", error_stage=stage or "synthesis")
        self._count("errors" if outcome == "error" else outcome)
        for attempt in range(SEND_TRIES):
            try:
                self.send("segment_complete", pa.array([outcome]), md)
                return
            except Exception as exc:
                print(f"[{NODE_NAME}] ERROR segment_complete of text #{job.seq} not sent (try {attempt + 1}): "
                      f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)

    def _silence(self, job: Job) -> None:
        """SILENCE_ON_SKIP: one short silent ``audio`` message for a text that produced no audio (sent by the
        caller that claimed the job)."""
        if not self.settings.silence_on_skip:
            return
        voice = self.voice
        rate = SAMPLE_RATE
        md = dict(job.metadata)
        md.update(sample_rate=rate, duration=SILENCE_S, voice=str(getattr(voice, "name", "")),
                  language=str(getattr(voice, "language", "")), chunk_index=0, fragment_num=1, is_final=True,
                  is_streaming=bool(self.settings.streaming), silent=True)
        audio = np.zeros(int(rate * SILENCE_S), dtype=np.float32)
        try:
            self.send("audio", pa.array(audio) if self.settings.audio_format == "flat" else pa.array([audio]), md)
        except Exception as exc:
            self.log("ERROR", f"silent audio for text #{job.seq} not sent: {type(exc).__name__}: {exc}")

    def _fail(self, job: Job, error: str, stage: str) -> bool:
        """Answer ``job`` with an error: claimed first, so a text gets one ``status: error`` and one
        ``segment_complete`` whoever else (worker, reset, STOP, supervisor) tries to answer it at the same time."""
        error = clip(error, ERROR_MAX_CHARS)
        with self._answer_lock:
            if not job.claim():
                return False
            if stage not in ("reset", "stop"):
                self._silence(job)
            level = "WARNING" if stage in ("reset", "stop", "busy") else "ERROR"
            self.log(level, f"text #{job.seq} ({_describe(job.metadata)}): {stage} error: {error}")
            try:
                self.status("error", job.metadata, level=level, message=error, error=error, error_stage=stage,
                            seq=job.seq)
            except Exception as exc:
                self.log("ERROR", f"status for text #{job.seq} not sent: {type(exc).__name__}: {exc}")
            self._send_complete(job, "error", error, stage)
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
        self._seq += 1
        self._count("texts")
        problems: list[str] = []
        md = _metadata(metadata, problems)
        if problems:
            self.log("WARNING", f"text #{self._seq}: metadata not echoed as sent: {'; '.join(problems)[:1000]}")
        if not normalize_segment_index(md) and not self._warned_index:
            self._warned_index = True
            self.log("WARNING", f"segment_index {md['segment_index']!r} is not a number: passed on unchanged "
                                "(players compute segment_index + 1)")
        md.setdefault("question_id", "default")
        md.setdefault("session_status", "unknown")
        job = Job("text", md, seq=self._seq, stamp=st)
        try:
            job.request = self._parse(decode_text_value(value), md)
        except InputError as exc:
            job.error = str(exc)
        except Exception as exc:  # anything a hostile payload provokes (RecursionError from deep JSON, ...)
            job.error = f"unreadable text: {type(exc).__name__}"
        if self._stopping.is_set():
            self._fail(job, STOPPING, "stop")
            return
        mark = self._reset_mark
        if st is not None and mark is not None and st.before(mark):  # sent before a reset that came first
            with self._answer_lock:
                if self._fail(job, CANCELLED, "reset"):
                    self._count("cancelled")
            return
        try:
            self.jobs.put(job)
        except QueueFull as exc:
            self._count("busy")
            self._fail(job, str(exc), "busy")

    def _parse(self, raw: str, md: dict) -> TextRequest:
        """The request of one text; with PRIMESPEECH_LLM_TEXT its text is what the session's LLM filter leaves of it
        (reasoning, tool calls and code spanning messages dropped; "" makes it a skipped text)."""
        if self.llm is None or len(raw) > self.settings.max_text_chars:  # too long: refused with an error anyway
            return parse_text(raw)
        stream = self.llm.get(md.get("session_id", "default"), md.get("question_id"))
        try:
            req = parse_text(raw)
        except InputError:
            if stream.in_block is None:
                raise
            req = TextRequest(text=raw)  # a tool call's JSON arguments, a line of code: part of the open block
        overflows = stream.overflows
        req.text = stream.feed(req.text)
        if stream.overflows != overflows:
            self.log("WARNING", f"a reasoning/tool-call/code block open for {llm.MAX_BLOCK_MESSAGES} messages or "
                                f"{llm.MAX_BLOCK_CHARS} characters was closed ({_describe(md)})")
        req.overrides["llm_text"] = False  # cleaned here; the engine does not clean it again
        return req

    def _on_control(self, value: Any, md: dict, st: Stamp | None = None) -> None:
        try:
            command = parse_control(decode_text_value(value))
        except Exception as exc:
            self.log("ERROR", str(exc))
            self.status("error", md, level="ERROR", message=str(exc), error=str(exc), command="unknown")
            return
        if command.name == "reset":
            self._reset(md, st)
        elif command.name == "change_voice":
            self.jobs.put(Job("control", md, command=command, stamp=st))
        elif not self.ready.is_set() or self.engine is None:
            self.status("error", md, level="ERROR", message="not ready", error="not ready", command=command.name)
        elif command.name == "cleanup":  # on the worker, between two jobs: never stalls a text's audio
            self.jobs.put(Job("control", md, command=command), front=True)
        else:
            self._run_control(command, md)

    def _reset(self, md: dict, st: Stamp | None = None) -> None:
        if self.llm is not None:
            self.llm.reset()  # open reasoning/code blocks are forgotten with the texts
        if st is not None and (self._reset_mark is None or self._reset_mark.before(st)):
            self._reset_mark = st
        n = self._cancel_texts(CANCELLED, "reset", st)
        self._playing_until = None  # a player may drop what it holds on a reset: the next text plans without it
        self.log("INFO", f"reset: {n} text(s) cancelled")
        self.status("reset", md, message=f"reset: {n} text(s) cancelled", cancelled=n)

    def _cancel_texts(self, reason: str, stage: str, before: Stamp | None = None) -> int:
        """Cancel the queued texts and the one in flight (only those sent before ``before``, when given); each
        counts (and is answered) once."""
        with self._answer_lock:
            queued, current = self.jobs.take(("text",), before)
            n = 0
            if current is not None and not current.answered and not current.cancel.is_set():
                current.error, current.error_stage = reason, stage
                current.cancel.set()  # the engine stops at its next cancellation point; its answer is this one
                n += self._fail(current, reason, stage)
            for job in queued:
                n += self._fail(job, reason, stage)
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
        if not has_speakable(text):
            self.log("DEBUG", f"text #{job.seq}: nothing to speak ({text[:40]!r}), skipped")
            self._skip(job)
            return
        if len(text) > self.settings.max_text_chars:
            self._fail(job, f"text too long: {len(text)} characters (MAX_TEXT_CHARS={self.settings.max_text_chars})",
                       "input")
            return
        try:
            voice = self._request_voice(req, job.stamp)
        except (VoiceNotFoundError, VoiceNotInstalledError, ConfigError) as exc:
            self._fail(job, str(exc), "voice")
            return
        language = req.overrides.get("text_lang") or voice.language
        self.status("synthesizing", job.metadata, seq=job.seq, voice=voice.name, language=language,
                    characters=len(text))
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
            elapsed=round(elapsed, 3), chunks=chunks))

    def _skip(self, job: Job) -> None:
        self._complete(job, "skipped", lambda: self._silence(job))

    def _synthesize(self, job: Job, text: str, voice, language: str, req: TextRequest):
        overrides = dict(req.overrides)
        total, n, timings = 0.0, 0, {}
        if self.settings.streaming:
            for chunk in self.engine.synthesize_stream(text, voice=voice, cancel=job.cancel, key=job.seq,
                                                       upcoming=self._upcoming, playing_until=self._playing_until,
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
            if job.answered or job.error is not None or req is None or job.cancel.is_set():
                continue
            if not has_speakable(req.text) or len(req.text) > self.settings.max_text_chars:
                continue
            try:
                voice = self._request_voice(req, job.stamp)
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
        md = dict(job.metadata)
        md.update(sample_rate=sample_rate, duration=float(duration), voice=str(voice.name), language=str(language),
                  chunk_index=int(index), fragment_num=int(index) + 1, is_final=bool(final),
                  is_streaming=bool(streaming))
        array = pa.array(audio) if self.settings.audio_format == "flat" else pa.array([audio])
        with job.answer_lock:  # never audio after the text's segment_complete (e.g. a reset answered it)
            if not job.answered:
                self.send("audio", array, md)
                now = time.perf_counter()
                self._playing_until = max(now, self._playing_until or now) + duration
        return duration

    def _voice_at(self, st: Stamp | None):
        """The voice for a text sent at ``st``: the current one, unless a change_voice sent after the text has
        already run (the text arrived late), then the voice before the earliest such change."""
        if st is not None:
            for changed_at, previous in self._voice_log:
                if changed_at is not None and st.before(changed_at):
                    return previous
        return self.voice

    def _request_voice(self, req: TextRequest, st: Stamp | None = None):
        from ..assets.catalog import custom_voice, resolve_voice

        choice = req.voice
        if choice is None:
            return self._voice_at(st)
        root = self.settings.model_dir
        if choice.kind == "name":
            if choice.name == self.voice.name:
                return self.voice
            return resolve_voice(choice.name, root)
        # CUSTOM: zero-shot cloning with the current voice's weights (Doubao by default, as the old node);
        # TRAINED: own weights, the current voice's encoders.
        roots = request_roots(root, self.settings.voices_dir, self.settings.request_paths)
        return custom_voice(choice.reference, choice.prompt_text or "", choice.lang or "auto",
                            gpt=choice.gpt, sovits=choice.sovits, base=self.voice, root=root, roots=roots)

    # -- control --------------------------------------------------------------------------------------
    def _run_control(self, cmd, md: dict) -> None:
        try:
            if cmd.name == "stats":
                stats = _jsonable(self.engine.stats())
                with self._lock:
                    counts = dict(self.counts)
                self.status("stats", md, stats=stats, node_counts=counts, voice=self.voice.name,
                            queued=self.jobs.pending(), message=f"{counts['texts']} text(s), voice {self.voice.name}")
            elif cmd.name == "list_voices":
                voices = _jsonable(self.engine.list_voices())
                self.status("voices", md, voices=voices, current=self.voice.name,
                            message=f"{len(voices)} voice(s), current {self.voice.name}")
            elif cmd.name == "cleanup":
                freed = self.engine.cleanup() if hasattr(self.engine, "cleanup") else None
                self.status("cleanup", md, freed=_jsonable(freed), message="caches freed")
        except Exception as exc:
            self.log("ERROR", f"control {cmd.name} failed: {exc}")
            self.status("error", md, level="ERROR", message=str(exc), error=str(exc), command=cmd.name)

    def _change_voice(self, name: str, md: dict, st: Stamp | None = None) -> None:
        from ..assets.catalog import resolve_voice

        old = self.voice
        try:
            spec = resolve_voice(name, self.settings.model_dir)
            self.log("INFO", f"loading voice {spec.name} ...")
            self.engine.load_voice(spec)
        except Exception as exc:  # any failure: the previous voice stays current
            self.voice, error = old, clip(exc, ERROR_MAX_CHARS)
            self.log("ERROR", f"change_voice failed, keeping {old.name}: {error}")
            self.status("error", md, level="ERROR", message=error, error=error, command="change_voice",
                        voice=old.name)
            return
        self.voice = spec
        self._voice_log = [*self._voice_log, (st, old)][-VOICE_LOG:]
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


def _describe(md: dict) -> str:
    keys = ("question_id", "session_id", "segment_index")
    return ", ".join(f"{k}={md[k]}" for k in keys if k in md) or "no ids"


def _jsonable(x: Any) -> Any:
    """Dataclasses, Paths and numpy values made JSON-friendly."""
    if hasattr(x, "__dataclass_fields__"):
        x = {k: getattr(x, k) for k in x.__dataclass_fields__}
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    if x is None or isinstance(x, (str, int, float, bool)):
        return x
    return str(x)
