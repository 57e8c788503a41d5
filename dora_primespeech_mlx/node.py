"""The Dora node: a drop-in replacement for the old ``dora-primespeech`` node.

Two ways to run it, sharing one :class:`MessageHandler` (which holds no model logic; the engine does):

- ``path: dora-primespeech-mlx`` (console script :func:`main`), the usual form;
- ``operator: {python: dora_primespeech_mlx/node.py, inputs: ..., outputs: ...}`` (class :class:`Operator`).

Only the Dora API subset shared by dora-rs 0.3.x and 1.x is used: ``Node()``, ``node.next(timeout)``,
``event["type" | "id" | "value" | "metadata"]`` and ``send_output(id, pa.Array, dict)``.

Inputs: ``text`` (plain text, JSON payload, ``VOICE:`` prefixes; see :mod:`.messages`), ``control``
(reset, stats, list_voices, change_voice:NAME, cleanup) and ``reset`` (any value: same as the control
command; old dataflows wire one).

Outputs:

- ``audio``: ``pa.array([float32 samples])`` (ListArray of length 1, as the old node) or, with
  ``AUDIO_FORMAT=flat``, ``pa.array(float32 samples)``. Metadata: the incoming metadata plus
  ``sample_rate`` (int), ``duration`` (float s), ``voice``, ``language``, ``chunk_index`` (int, 0-based),
  ``fragment_num`` (int, 1-based), ``is_final`` (bool), ``is_streaming`` (bool).
- ``segment_complete``: ``pa.array(["completed" | "skipped" | "error"])`` with the incoming metadata
  (plus ``error``, ``error_stage`` and ``session_status: "error"`` on error). **Every ``text`` input gets
  exactly one ``segment_complete``**, in input order, on every path: spoken (completed), nothing to
  speak (skipped, including the segmenter's empty ``session_status: "ended"`` flush), any error
  (error), and texts cancelled by ``reset`` (error, ``error: "cancelled by reset"``,
  ``error_stage: "reset"``) - the one being spoken and all queued ones.
- ``status``: a StringArray holding one JSON object ``{"status": ..., "node", "level", "message",
  "timestamp"}``: ``synthesizing`` / ``done`` / ``error`` per text, ``ready`` at start, and the control
  answers ``reset`` (``cancelled``: n), ``stats``, ``voices``, ``voice_changed``, ``cleanup``.
- ``log``: a StringArray holding ``{"node", "level", "message", "timestamp"}`` JSON, filtered by LOG_LEVEL
  (also printed to stderr, where ``dora run`` shows it).

Threading: synthesis runs in one worker thread fed by a FIFO queue, so the event loop keeps reading
(``reset`` can cancel a long synthesis). Sends are serialised by a lock. With dora-rs 1.x the worker sends
while the main thread waits in ``next()``; with 0.3.x (where that is not allowed) outputs go through a
queue drained by the main thread between ``next(timeout)`` calls (see :func:`_sends_from_worker`).
:class:`Operator` explains how ``on_event`` lends time to the worker in the operator form.
"""

from __future__ import annotations

import gc
import importlib.metadata
import json
import math
import os
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa

# Absolute imports: the operator runtime loads this file by path, as a top-level module.
from dora_primespeech_mlx.errors import (
    ConfigError,
    NothingToSpeakError,
    PrimeSpeechError,
    SynthesisCancelled,
    SynthesisError,
    VoiceNotFoundError,
    VoiceNotInstalledError,
)
from dora_primespeech_mlx.messages import (
    ControlCommand,
    InputError,
    TextRequest,
    decode_text_value,
    has_speakable,
    parse_control,
    parse_text,
    sanitize_metadata,
)
from dora_primespeech_mlx.settings import LOG_LEVELS, Settings

NODE_NAME = "primespeech"
POLL_S = 0.05  # how often the node form looks at the outbox while the worker is busy
CANCELLED = "cancelled by reset"

Emit = Callable[[str, pa.Array, dict], None]
EngineFactory = Callable[[Callable[[str], None]], tuple[Any, Any]]  # progress -> (engine, start VoiceSpec)


# ---------------------------------------------------------------------------------------------------
# Jobs and their queue


@dataclass
class Job:
    kind: str  # "text" | "control"
    metadata: dict
    seq: int = 0
    request: TextRequest | None = None
    command: ControlCommand | None = None
    error: str | None = None  # input already known to be bad, or why the job was cancelled
    error_stage: str = "input"
    cancel: threading.Event = field(default_factory=threading.Event)


class JobQueue:
    """FIFO of jobs plus the one in flight; ``idle`` means nothing queued and nothing running."""

    def __init__(self):
        self._jobs: deque[Job | None] = deque()
        self._cv = threading.Condition()
        self.current: Job | None = None

    def put(self, job: Job | None) -> None:
        with self._cv:
            self._jobs.append(job)
            self._cv.notify_all()

    def get(self) -> Job | None:
        with self._cv:
            while not self._jobs:
                self._cv.wait()
            job = self._jobs.popleft()
            self.current = job
            return job

    def done(self) -> None:
        with self._cv:
            self.current = None
            self._cv.notify_all()

    def take_texts(self) -> tuple[list[Job], Job | None]:
        """Remove every queued text job; return them and the text job in flight (if any)."""
        with self._cv:
            texts = [j for j in self._jobs if j is not None and j.kind == "text"]
            self._jobs = deque(j for j in self._jobs if j is None or j.kind != "text")
            current = self.current if self.current is not None and self.current.kind == "text" else None
            return texts, current

    def idle(self) -> bool:
        with self._cv:
            return not self._jobs and self.current is None

    def wait_idle(self, timeout: float | None = None) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: not self._jobs and self.current is None, timeout)


# ---------------------------------------------------------------------------------------------------
# The handler


class MessageHandler:
    """Turns Dora inputs into outputs through ``emit(output_id, array, metadata)``.

    ``on_input`` is called from the event thread and never blocks on the engine; a worker thread loads
    the engine (``engine_factory``) and then runs the jobs. ``emit`` is called from both threads.
    """

    def __init__(self, settings: Settings, engine_factory: EngineFactory, emit: Emit):
        self.settings = settings
        self._factory = engine_factory
        self._emit = emit
        self._jobs = JobQueue()
        self._seq = 0
        self._emit_lock = threading.Lock()
        self.engine: Any = None
        self.voice: Any = None  # current VoiceSpec
        self.ready = threading.Event()
        self._finished = threading.Event()
        self.startup_error: BaseException | None = None
        self.counts = {"texts": 0, "completed": 0, "skipped": 0, "errors": 0, "cancelled": 0}
        self._thread = threading.Thread(target=self._worker, name="primespeech-worker", daemon=True)
        self._warned_rate = False

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def idle(self) -> bool:
        return self.ready.is_set() and self._jobs.idle()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block (GIL released) until nothing is queued or running, at most ``timeout`` seconds."""
        return self._jobs.wait_idle(timeout)

    def stop_worker(self, cancel: bool = False) -> None:
        """Let the worker finish the queued jobs (or, with ``cancel``, answer the texts as cancelled)
        and then end; returns at once (see :meth:`worker_alive`)."""
        if cancel:
            self._cancel_texts("cancelled: the node is stopping", "stop")
        self._jobs.put(None)

    def worker_alive(self) -> bool:
        """False once the worker has finished its jobs after :meth:`stop_worker` (it then parks)."""
        return not self._finished.is_set()

    def close(self, cancel: bool = False, timeout: float | None = None) -> None:
        self.stop_worker(cancel)
        self._finished.wait(timeout)

    # -- output helpers -------------------------------------------------------------------------------

    def send(self, output: str, array: pa.Array, metadata: dict) -> None:
        with self._emit_lock:
            self._emit(output, array, metadata)

    def log(self, level: str, message: str) -> None:
        if LOG_LEVELS.index(level) < LOG_LEVELS.index(self.settings.log_level):
            return
        print(f"[{NODE_NAME}] {level} {message}", file=sys.stderr, flush=True)
        record = {"node": NODE_NAME, "level": level, "message": message, "timestamp": int(time.time())}
        self.send("log", pa.array([json.dumps(record, ensure_ascii=False)]), {"node": NODE_NAME, "level": level})

    def status(self, status: str, metadata: dict | None = None, level: str = "INFO", message: str = "",
               **fields) -> None:
        body = {"status": status, "node": NODE_NAME, "level": level, "message": message or status,
                "timestamp": int(time.time()), **fields}
        self.send("status", pa.array([json.dumps(body, ensure_ascii=False, default=str)]), dict(metadata or {}))

    def _segment_complete(self, job: Job, outcome: str, error: str | None = None, stage: str | None = None):
        md = dict(job.metadata)
        if outcome == "error":
            md.update(session_status="error", error=error or "error", error_stage=stage or "synthesis")
            self.counts["errors"] += 1
        else:
            self.counts[outcome] += 1
        self.send("segment_complete", pa.array([outcome]), md)

    def _fail(self, job: Job, error: str, stage: str) -> None:
        level = "WARNING" if stage in ("reset", "stop") else "ERROR"
        self.log(level, f"text #{job.seq} ({_describe(job.metadata)}): {stage} error: {error}")
        self.status("error", job.metadata, level=level, message=error, error=error, error_stage=stage,
                    seq=job.seq)
        self._segment_complete(job, "error", error, stage)

    # -- event thread ---------------------------------------------------------------------------------

    def on_input(self, input_id: str, value: Any, metadata: Any) -> None:
        """Handle one INPUT event (never raises; bad input is answered on status/log)."""
        try:
            md = sanitize_metadata(metadata)
            if input_id == "text":
                self._on_text(value, md)
            elif input_id == "control":
                self._on_control(value, md)
            elif input_id == "reset":
                self._reset(md)
            else:
                self.log("DEBUG", f"ignoring input {input_id!r} (this node reads text, control and reset)")
        except Exception as exc:  # keep serving whatever happens
            self.log("ERROR", f"input {input_id!r} failed: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")

    def _on_text(self, value: Any, md: dict) -> None:
        self._seq += 1
        md.setdefault("question_id", "default")
        md.setdefault("session_status", "unknown")
        job = Job("text", md, seq=self._seq)
        try:
            job.request = parse_text(decode_text_value(value))
        except InputError as exc:
            job.error = str(exc)
        self.counts["texts"] += 1
        self._jobs.put(job)

    def _on_control(self, value: Any, md: dict) -> None:
        try:
            command = parse_control(decode_text_value(value))
        except InputError as exc:
            self.log("ERROR", str(exc))
            self.status("error", md, level="ERROR", message=str(exc), error=str(exc), command="unknown")
            return
        if command.name == "reset":
            self._reset(md)
        else:
            self._jobs.put(Job("control", md, command=command))

    def _reset(self, md: dict) -> None:
        n = self._cancel_texts(CANCELLED, "reset")
        self.log("INFO", f"reset: {n} text(s) cancelled")
        self.status("reset", md, message=f"reset: {n} text(s) cancelled", cancelled=n)

    def _cancel_texts(self, reason: str, stage: str) -> int:
        queued, current = self._jobs.take_texts()
        if current is not None and not current.cancel.is_set():
            current.error, current.error_stage = reason, stage  # the worker answers when the engine stops
            current.cancel.set()
        for job in queued:
            self.counts["cancelled"] += 1
            self._segment_complete(job, "error", reason, stage)
        return len(queued) + (1 if current is not None else 0)

    # -- worker thread --------------------------------------------------------------------------------

    def _worker(self) -> None:
        try:
            self._work()
        finally:
            # Never let this thread end: a thread that used MLX aborts the process in its thread-local
            # teardown ("terminate called without an active exception", MLX 0.32 on Linux, seen in
            # about half of the runs), so it parks (a daemon thread) and the process exits around it.
            self._finished.set()
            threading.Event().wait()

    def _work(self) -> None:
        try:
            self.engine, self.voice = self._factory(lambda m: self.log("INFO", m))
        except BaseException as exc:
            self.startup_error = exc
            self.ready.set()
            return
        self.ready.set()
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                if job.kind == "text":
                    self._run_text(job)
                else:
                    self._run_control(job)
            except Exception as exc:
                self.log("ERROR", f"internal error: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
                if job is not None and job.kind == "text":
                    self._fail(job, f"internal error: {exc}", "node")
            finally:
                self._jobs.done()

    def _run_text(self, job: Job) -> None:
        if job.error is not None:
            self._fail(job, job.error, job.error_stage)
            return
        req = job.request
        for w in req.warnings:
            self.log("WARNING", f"text #{job.seq}: {w}")
        text = req.text
        if not has_speakable(text):
            self.log("DEBUG", f"text #{job.seq}: nothing to speak ({text[:40]!r}), skipped")
            self._segment_complete(job, "skipped")
            return
        if len(text) > self.settings.max_text_chars:
            self._fail(job, f"text too long: {len(text)} characters (MAX_TEXT_CHARS={self.settings.max_text_chars})",
                       "input")
            return
        try:
            voice = self._request_voice(req)
        except (VoiceNotFoundError, VoiceNotInstalledError, ConfigError) as exc:
            self._fail(job, str(exc), "voice")
            return
        language = req.overrides.get("text_lang") or voice.language
        self.status("synthesizing", job.metadata, seq=job.seq, voice=voice.name, language=language,
                    characters=len(text))
        t0 = time.perf_counter()
        try:
            duration, chunks, timings = self._synthesize(job, text, voice, language, req)
        except NothingToSpeakError as exc:
            self.log("DEBUG", f"text #{job.seq}: nothing to speak ({exc}), skipped")
            self._segment_complete(job, "skipped")
            return
        except SynthesisError as exc:
            self._fail(job, str(exc), getattr(exc, "stage", "synthesis"))
            return
        except (PrimeSpeechError, ValueError) as exc:  # text front end, bad request parameters
            self._fail(job, f"{exc}", "text" if type(exc).__module__.endswith("text.errors") else "request")
            return
        if job.cancel.is_set():
            self.counts["cancelled"] += 1
            self._fail(job, job.error or CANCELLED, job.error_stage if job.error else "reset")
            return
        elapsed = time.perf_counter() - t0
        rtf = elapsed / duration if duration > 0 else math.inf
        if self.settings.log_timing:
            detail = ", ".join(f"{k} {v:.2f}s" for k, v in (timings or {}).items() if isinstance(v, (int, float)))
            self.log("INFO", f"text #{job.seq}: {duration:.2f} s of audio in {elapsed:.2f} s (RTF {rtf:.2f}), "
                             f"{chunks} chunk(s), voice {voice.name}" + (f"; {detail}" if detail else ""))
        self.status("done", job.metadata, seq=job.seq, voice=voice.name, duration=round(duration, 3),
                    elapsed=round(elapsed, 3), chunks=chunks)
        self._segment_complete(job, "completed")

    def _synthesize(self, job: Job, text: str, voice, language: str, req: TextRequest):
        overrides = dict(req.overrides)
        streaming = self.settings.streaming
        total, n, timings = 0.0, 0, {}
        if job.cancel.is_set():
            return total, n, timings
        if streaming:
            for chunk in self.engine.synthesize_stream(text, voice=voice, cancel=job.cancel, **overrides):
                if job.cancel.is_set():
                    break
                total += self._send_audio(job, chunk.audio, chunk.sample_rate, voice, language,
                                          chunk.chunk_index, bool(chunk.is_final), True, req.volume)
                n += 1
            return total, n, timings
        try:
            result = self.engine.synthesize(text, voice=voice, cancel=job.cancel, **overrides)
        except SynthesisCancelled:
            return 0.0, 0, {}
        if job.cancel.is_set():
            return 0.0, 0, {}
        total = self._send_audio(job, result.audio, result.sample_rate, voice, language, 0, True, False,
                                 req.volume)
        return total, 1, dict(getattr(result, "timings", {}) or {})

    def _send_audio(self, job: Job, audio, sample_rate: int, voice, language: str, index: int, final: bool,
                    streaming: bool, volume: float | None) -> float:
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
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
        self.send("audio", array, md)
        return duration

    def _request_voice(self, req: TextRequest):
        from dora_primespeech_mlx.voices import custom_voice, resolve_voice

        choice = req.voice
        if choice is None:
            return self.voice
        root = self.settings.model_dir
        if choice.kind == "name":
            if choice.name == self.voice.name:
                return self.voice
            return resolve_voice(choice.name, root)
        # CUSTOM: zero-shot cloning with the current voice's weights (Doubao by default, as the old node);
        # TRAINED: own weights, the current voice's encoders.
        return custom_voice(choice.reference, choice.prompt_text or "", choice.lang or "auto",
                            gpt=choice.gpt, sovits=choice.sovits, base=self.voice, root=root)

    def _run_control(self, job: Job) -> None:
        cmd, md = job.command, job.metadata
        try:
            if cmd.name == "stats":
                stats = _jsonable(self.engine.stats())
                self.status("stats", md, stats=stats, node_counts=dict(self.counts), voice=self.voice.name,
                            message=f"{self.counts['texts']} text(s), voice {self.voice.name}")
            elif cmd.name == "list_voices":
                voices = _jsonable(self.engine.list_voices())
                self.status("voices", md, voices=voices, current=self.voice.name,
                            message=f"{len(voices)} voice(s), current {self.voice.name}")
            elif cmd.name == "change_voice":
                self._change_voice(cmd.arg, md)
            elif cmd.name == "cleanup":
                self._cleanup(md)
        except Exception as exc:
            self.log("ERROR", f"control {cmd.name} failed: {exc}")
            self.status("error", md, level="ERROR", message=str(exc), error=str(exc), command=cmd.name)

    def _change_voice(self, name: str, md: dict) -> None:
        from dora_primespeech_mlx.voices import resolve_voice

        old = self.voice
        try:
            spec = resolve_voice(name, self.settings.model_dir)
            self.log("INFO", f"loading voice {spec.name} ...")
            self.engine.load_voice(spec)
        except (PrimeSpeechError, OSError, ValueError) as exc:
            self.voice = old
            self.log("ERROR", f"change_voice:{name} failed, keeping {old.name}: {exc}")
            self.status("error", md, level="ERROR", message=str(exc), error=str(exc), command="change_voice",
                        voice=old.name)
            return
        self.voice = spec
        self.log("INFO", f"voice changed to {spec.name} ({spec.language})")
        self.status("voice_changed", md, voice=spec.name, language=spec.language, previous=old.name,
                    message=f"voice {spec.name}")

    def _cleanup(self, md: dict) -> None:
        freed = None
        if hasattr(self.engine, "cleanup"):
            freed = self.engine.cleanup()
        gc.collect()
        try:
            import mlx.core as mx

            mx.clear_cache()
        except (ImportError, AttributeError):
            pass
        self.status("cleanup", md, freed=_jsonable(freed), message="caches freed")


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


# ---------------------------------------------------------------------------------------------------
# Engine construction (models load here, before the event loop)


def engine_factory(settings: Settings) -> EngineFactory:
    """A factory that builds the engine, loads the start voice and warms up, reporting progress."""

    def build(progress: Callable[[str], None]):
        from dora_primespeech_mlx.engine import GPTSoVITSEngine, SynthesisConfig
        from dora_primespeech_mlx.voices import resolve_voice

        try:
            spec = resolve_voice(settings.voice, settings.model_dir)
        except VoiceNotInstalledError:
            spec = resolve_voice(settings.voice, settings.model_dir, require_installed=False)
            if not (settings.auto_download and spec.source == "preset"):
                raise
            from dora_primespeech_mlx.download import download_voice

            progress(f"voice {spec.name} is not installed: downloading it into {settings.model_dir} "
                     "(PRIMESPEECH_AUTO_DOWNLOAD=false turns this off) ...")
            download_voice(spec.name, settings.model_dir)
            spec = resolve_voice(settings.voice, settings.model_dir)
        start = {k: v for k, v in (("language", settings.text_lang), ("prompt_lang", settings.prompt_lang),
                                   ("prompt_text", settings.prompt_text)) if v is not None}
        if start:
            spec = replace(spec, **start)
        config = SynthesisConfig().replace(**settings.sampling())
        progress(f"loading voice {spec.name} (device {settings.device}, encoders {settings.encoders}) ...")
        t0 = time.perf_counter()
        engine = GPTSoVITSEngine(model_dir=settings.model_dir, device=settings.device, encoders=settings.encoders,
                                 config=config, progress=progress)
        engine.load_voice(spec)
        progress(f"voice {spec.name} loaded in {time.perf_counter() - t0:.1f} s")
        if settings.warmup:
            t0 = time.perf_counter()
            engine.warmup()
            progress(f"warm-up done in {time.perf_counter() - t0:.1f} s")
        return engine, spec

    return build


def _startup_hint(exc: BaseException) -> str:
    if isinstance(exc, VoiceNotInstalledError):
        return ""  # its message already says how to download / where to put the files
    if isinstance(exc, VoiceNotFoundError):
        return " (set VOICE_NAME to one of the listed voices; `primespeech-mlx voices` lists them)"
    return ""


# ---------------------------------------------------------------------------------------------------
# Node form


def _is_timeout(event: dict) -> bool:
    return event.get("type") == "ERROR" and "timed out" in str(event.get("error", "")).lower()


def _sends_from_worker() -> bool:
    """Whether the worker may call ``send_output`` while the main thread waits in ``next()``.

    dora-rs 1.x: yes (its ``Node`` methods take ``&self``; verified with 1.1). dora-rs 0.3.x borrows the
    node mutably inside ``next()``, so there every output is funnelled through the main thread, which then
    polls with ``next(timeout)``. Polling is avoided on 1.x because ``next(timeout)`` of dora-rs 1.1 loses
    events now and then (verified: 1 of 450 inputs lost). ``PRIMESPEECH_DORA_SENDS=worker|main`` overrides.
    """
    forced = os.environ.get("PRIMESPEECH_DORA_SENDS", "").strip().lower()
    if forced in ("worker", "main"):
        return forced == "worker"
    try:
        return int(importlib.metadata.version("dora-rs").split(".")[0]) >= 1
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return True


def main() -> int:
    """Console script ``dora-primespeech-mlx``: run as a Dora node until the dataflow stops."""
    from dora import Node

    node = Node()  # outside a dataflow this raises RuntimeError, as every dora node does
    direct = _sends_from_worker()
    outbox: deque[tuple[str, pa.Array, dict]] = deque()

    def emit(*out) -> None:
        if direct:
            node.send_output(*out)  # serialised by the handler's lock
        else:
            outbox.append(out)

    def flush() -> None:
        while outbox:
            node.send_output(*outbox.popleft())

    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        handler = MessageHandler(Settings(), lambda p: (None, None), emit)
        handler.log("ERROR", str(exc))
        handler.status("error", level="ERROR", message=str(exc), error=str(exc), error_stage="init")
        flush()
        return 2

    handler = MessageHandler(settings, engine_factory(settings), emit)
    handler.start()
    while not handler.ready.wait(POLL_S):
        flush()
    if handler.startup_error is not None:
        exc = handler.startup_error
        msg = f"cannot start: {exc}{_startup_hint(exc)}"
        handler.log("ERROR", msg)
        handler.status("error", level="ERROR", message=msg, error=str(exc), error_stage="init")
        flush()
        return 2
    handler.status("ready", voice=handler.voice.name, language=handler.voice.language,
                   streaming=settings.streaming, message=f"ready, voice {handler.voice.name}")
    flush()

    cancel_on_exit = False
    while True:
        idle = handler.idle()  # read before flushing: once idle, every output is already in the outbox
        flush()
        event = node.next() if direct or idle else node.next(timeout=POLL_S)
        if event is None:
            break
        kind = event.get("type")
        if kind == "INPUT":
            handler.on_input(event.get("id"), event.get("value"), event.get("metadata"))
        elif kind == "STOP":
            cancel_on_exit = event.get("id") not in (None, "ALL_INPUTS_CLOSED")
            break
        elif kind == "ERROR" and not _is_timeout(event):
            handler.log("WARNING", f"dora error event: {str(event.get('error'))[:300]}")
    # Finish (or cancel, on a manual stop) the queued texts.
    handler.stop_worker(cancel=cancel_on_exit)
    while handler.worker_alive():
        flush()
        time.sleep(POLL_S / 2)
    flush()
    return 0


# ---------------------------------------------------------------------------------------------------
# Operator form


class Operator:
    """``operator: python:`` form. The runtime calls :meth:`on_event` for every event.

    dora's Python operator runtime (1.1, verified) keeps the GIL while it waits for the next event, so
    the worker thread only runs while ``on_event`` is running. Hence ``on_event`` waits (GIL released)
    for the worker: until it is idle, i.e. each text is spoken inside the ``on_event`` of its input -
    unless the operator has a ``tick`` input (e.g. ``tick: dora/timer/millis/50``); then every event
    lends the worker at most ``SLICE_S`` seconds and returns, so ``reset`` and ``control`` inputs get
    through during a long synthesis, as in the node form. When the ``text`` input closes, the operator
    finishes the queued texts and stops (a timer input alone would keep the dataflow running).
    """

    SLICE_S = 0.05

    def __init__(self):
        self._send_output = None
        self._pending: deque[tuple[str, pa.Array, dict]] = deque()
        self._lock = threading.Lock()
        self._sliced = False
        settings = Settings.from_env()  # a bad variable fails the operator at start, with the list
        self.handler = MessageHandler(settings, engine_factory(settings), self._emit)
        self.handler.start()
        self.handler.ready.wait()
        if self.handler.startup_error is not None:
            exc = self.handler.startup_error
            raise RuntimeError(f"dora-primespeech-mlx cannot start: {exc}{_startup_hint(exc)}") from exc
        self.handler.status("ready", voice=self.handler.voice.name, language=self.handler.voice.language,
                            streaming=settings.streaming, message=f"ready, voice {self.handler.voice.name}")

    def _emit(self, output: str, array: pa.Array, metadata: dict) -> None:
        with self._lock:
            if self._send_output is None:
                self._pending.append((output, array, metadata))
            else:
                self._send_output(output, array, metadata)

    def on_event(self, dora_event: dict, send_output) -> Any:
        from dora import DoraStatus

        with self._lock:
            self._send_output = send_output
            while self._pending:
                send_output(*self._pending.popleft())
        kind = dora_event.get("type")
        if kind == "INPUT":
            if dora_event.get("id") == "tick":
                self._sliced = True
            else:
                self.handler.on_input(dora_event.get("id"), dora_event.get("value"), dora_event.get("metadata"))
        elif kind == "STOP":
            self.handler.close(cancel=dora_event.get("id") not in (None, "ALL_INPUTS_CLOSED"))
            return DoraStatus.STOP
        elif kind == "INPUT_CLOSED" and dora_event.get("id") == "text":
            # Nothing more to speak: finish the queue and stop (a `tick` input would keep it alive).
            self.handler.close()
            return DoraStatus.STOP
        self.handler.wait_idle(self.SLICE_S if self._sliced else None)
        return DoraStatus.CONTINUE


if __name__ == "__main__":
    sys.exit(main())
