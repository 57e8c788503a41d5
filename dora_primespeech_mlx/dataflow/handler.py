"""The node's logic without dora: inputs in, outputs out through a transport (``send(id, array, metadata)``).

:class:`MessageHandler` wires the parts, each a module of its own, and routes the inputs to them: the work queue
and the one-answer gate (:mod:`.jobs`), send order (:mod:`.order`), reset, barge-in and STOP
(:mod:`.cancellation`), the input metadata (:mod:`.inputs`), text intake with the LLM filter and the assembly of
streamed utterances (:mod:`.intake`, :mod:`.utterance`, :mod:`.sentences`), admission to the queue
(:mod:`.admission`), speaking a text (:mod:`.speech`), voices (:mod:`.voices`), the playback clock
(:mod:`.clock`), the answers (:mod:`.answers`), what is sent (:mod:`.outputs`), the control answers
(:mod:`.controls`) and the worker's life (:mod:`.worker`). Along the fixed flow the parts hold and call each other
directly (the intake its admission and answers, the admission the job queue, the worker the answers, the outputs
the voices); the queue tells the speaker when it changes (the speaker pushes it to the engine's board: the engine
never calls node code), and the worker is given the two things the handler decides: how the engine is built and
what a job is (a text spoken, a control answered). Keeping dora out makes every promise testable with a fake engine
and a fake transport; :class:`MessageHandler` lists the promises."""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from ..settings import Settings
from . import controls, params
from .admission import Admission
from .answers import Answers, describe
from .cancellation import CANCELLED, FLUSHED, STOPPING, Canceller
from .clock import PlaybackClock
from .inputs import TextMetadata, echoed
from .intake import Intake
from .jobs import Job, JobQueue
from .messages import InputError, clip, decode_text_value, parse_control
from .order import MAX_SKEW_S, Stamp, clamp, stamp
from .outputs import NODE_NAME, Counts, Outputs
from .params import ParameterError, Parameters
from .speech import Speaker
from .streams import Filters
from .utterance import Fragment, convention, session_of, without_convention
from .voices import Voices
from .worker import WATCH_S, Worker

__all__ = ["CANCELLED", "FLUSHED", "NODE_NAME", "STOPPING", "WATCH_S", "EngineFactory", "MessageHandler",
           "StartProgress"]

EngineFactory = Callable[[Callable[[str], None]], tuple[Any, Any]]  # progress -> (engine, start VoiceSpec)


class StartProgress:
    """The start-up's ``progress`` handed to the engine factory: a callable that logs each message, carrying
    ``text_waiting``, the work queue's event set once a text is queued (``engine.startup.start_engine`` then cuts
    the warm-up synthesis short: the first text does not wait for it)."""

    def __init__(self, say: Callable[[str], None], text_waiting: threading.Event):
        self._say, self.text_waiting = say, text_waiting

    def __call__(self, message: str) -> None:
        self._say(message)


class MessageHandler:
    """Turns dora inputs into outputs. Threads: the input thread (``on_input``, never blocks on the engine or the
    LLM stage), the intake thread, the worker (builds the engine with ``engine_factory`` and runs the queued jobs)
    and a supervisor.

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
    - **Cancel by session**: ``cancel`` (``session_id`` in its metadata, or ``cancel:SESSION``) cancels that
      session's texts and utterances sent before it, the others go on speaking; no audio is marked ``flush``.
    - **Bounded**: at most ``MAX_QUEUED_TEXTS`` texts (sentences of utterances included) wait; one more is
      answered at once with ``error`` (busy)."""

    def __init__(self, settings: Settings, engine_factory: EngineFactory, transport):
        self._factory = engine_factory
        self.transport = transport
        self.engine: Any = None
        self.voices = Voices(settings)
        self.clock = PlaybackClock()
        self.counts = Counts()
        self.out = Outputs(settings, transport, self.counts, self.clock, self.voices)
        self.settings = settings
        self.answers = Answers(self.out)
        self.params = Parameters()  # runtime parameters (dora param set): defaults beneath each text's own
        self.speaker = Speaker(self.voices, self.answers, self.params)
        self.jobs = JobQueue(settings.max_queued_texts, self.speaker.publish)  # what waits, pushed to the engine
        self._arrivals = 0  # inputs received (the order fallback)
        # PRIMESPEECH_LLM_TEXT: one LLM stream filter per plain-text session and question and one per streamed
        # segment (text/llm/), fed by the intake; each outlives the utterances of its segment (streams.py)
        self.filters = Filters(self.log, settings.llm_text)
        self.llm = self.filters if settings.llm_text else None
        self.worker = Worker(self.jobs, self._build, self._run_job, self.answers)
        self.ready, self.parked, self._stopping = self.worker.ready, self.worker.parked, self.worker.stopping
        self.admission = Admission(self.jobs, self.answers, self.llm, self._stopping)
        self.intake = Intake(self.admission, self.answers, llm_text=settings.llm_text, idle_s=settings.segment_idle_s,
                             filters=self.filters, max_held_chars=settings.max_held_chars,
                             max_chars=settings.max_intake_chars)
        self.cancellation = Canceller(self.intake, self.jobs, self.answers, self.filters, self.clock)
        self.marks = self.cancellation.marks  # the latest reset and barge-in: texts sent before them are cancelled
        self._text_metadata = TextMetadata(self.log)

    @property
    def settings(self) -> Settings:
        return self._settings

    @settings.setter
    def settings(self, settings: Settings) -> None:
        """Replacing the settings reaches every send (log level, streaming, silence, audio format)."""
        self._settings = self.out.settings = settings

    @property
    def voice(self):
        """The current voice (VoiceSpec)."""
        return self.voices.current

    @voice.setter
    def voice(self, spec) -> None:
        self.voices.current = spec

    @property
    def startup_error(self) -> BaseException | None:
        return self.worker.startup_error

    # -- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> None:
        self.intake.start()
        self.worker.start()

    def _build(self) -> None:
        """On the worker: build the engine and its first voice (a text queued meanwhile cuts the warm-up short:
        :class:`StartProgress`)."""
        self.engine, self.voice = self._factory(StartProgress(lambda m: self.log("INFO", m), self.jobs.text_arrived))
        self.speaker.engine = self.engine

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
        if not self.worker.drained(stall_s):
            self.stop()
            return False
        self._stopping.set()
        self.intake.stop()
        return True

    def stop(self) -> int:
        """STOP: answer the text in flight and every queued job as cancelled, without waiting for the engine."""
        self._stopping.set()
        self.jobs.close()
        n = self.cancellation.cancel(STOPPING, "stop")
        self.intake.stop()
        self.jobs.take(("control",))
        return n

    # -- outputs --------------------------------------------------------------------------------------
    def send(self, output: str, array: pa.Array, metadata: dict) -> None:
        self.out.send(output, array, metadata)

    def log(self, level: str, message: str) -> None:
        self.out.log(level, message)

    def status(self, status: str, metadata: dict | None = None, level: str = "INFO", message: str = "",
               **fields) -> None:
        self.out.status(status, metadata, level, message, **fields)

    # -- input thread ---------------------------------------------------------------------------------
    def on_input(self, input_id: str, value: Any, metadata: Any) -> None:
        """Handle one INPUT event. Never raises; every text is answered."""
        try:
            self._arrivals += 1
            st, clamped = clamp(stamp(metadata, self._arrivals))
            if clamped:
                self.log("WARNING", f"input {input_id!r} (arrival {self._arrivals}): its timestamp is ahead of the "
                                    f"node's clock by more than {MAX_SKEW_S:g} s: taken as sent on arrival")
            if input_id == "text":
                self._on_text(value, metadata, st)
            elif input_id == "control":
                self._on_control(value, echoed(metadata), st)
            elif input_id == "reset":
                self.cancellation.reset(echoed(metadata), st)
            else:
                self.log("DEBUG", f"ignoring input {input_id!r} (this node reads text, control and reset)")
        except Exception as exc:  # keep serving whatever happens
            self.log("ERROR", f"input {input_id!r} failed: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")

    def on_parameter(self, key: str, value: Any) -> None:
        """A runtime parameter set (``value``) or deleted (None) with ``dora param set`` / ``delete``: the control it
        stands for (:mod:`.params`) takes its place among the texts; a bad one is answered with an error status at
        once. Never raises."""
        md = {"parameter": str(key)}
        try:
            cmd = params.command(str(key), value)
        except ParameterError as exc:
            self.log("WARNING", str(exc))
            self.status("error", md, level="WARNING", message=str(exc), error=str(exc), reason=str(exc),
                        command="parameter")
            return
        except Exception as exc:  # keep serving whatever a value provokes
            self.log("ERROR", f"parameter {key!r} failed: {type(exc).__name__}: {exc}")
            return
        self.log("INFO", f"parameter {key} = {value!r}: queued behind the texts before it")
        self.intake.put_control(Job("control", md, command=cmd))

    def _on_text(self, value: Any, metadata: Any, st: Stamp | None = None) -> None:
        md = self._text_metadata.read(metadata, self._arrivals)
        segment_id, fragment_seq, fin, flush = convention(md)
        key = None if segment_id is None else (str(md.get("session_id", "default")), str(segment_id))
        self.counts.add("received" if key is None else "fragments")
        self.log("DEBUG", f"input {self._arrivals}: " + (
            f"text {self.counts['received']} received" if key is None else
            f"fragment {self.counts['fragments']} received (session {key[0]!r} segment {key[1]!r} "
            f"seq {clip(md.get('seq'), 40)})") + f" ({describe(md)})")
        if key is not None and st is not None:  # a fragment's seq numbers it within its segment, not among inputs
            st = Stamp(st.time, None, st.arrival)
        if key is not None and "seq" in md and (fragment_seq is None or fragment_seq < 0):
            self.log("WARNING", f"fragment of session {key[0]!r} segment {key[1]!r}: seq {clip(md['seq'])!r} is not "
                                "a fragment number (a whole number from 0): it joins in arrival order")
            fragment_seq = None
        if flush and not self._stopping.is_set():
            self.cancellation.barge_in(md, st, key)
        if key is not None:
            self._on_fragment(value, md, st, key, Fragment("", fragment_seq, fin))
            return
        job = Job("text", md, seq=self.admission.next_seq(), stamp=st)
        try:
            job.raw = decode_text_value(value)
        except InputError as exc:
            job.error = str(exc)
        except Exception as exc:  # anything a hostile payload provokes
            job.error = f"unreadable text: {type(exc).__name__}"
        if not self.admission.refused(job, self.marks.cancelled(st, session_of(md)), self.intake.queued_texts(),
                                      self.intake.room(len(job.raw or ""))):
            self.intake.put_text(job, job.raw or "")

    def _on_fragment(self, value: Any, md: dict, st: Stamp | None, key: tuple[str, str], fragment: Fragment) -> None:
        """A fragment of a streamed utterance: to the intake (answered with its utterance, never alone). One sent
        before a reset, a barge-in or a cancel of its session that arrives after it, or that comes once the node
        stops, is answered with its utterance as cancelled if that utterance is new, else dropped (its utterance was
        answered already)."""
        cancelled = (STOPPING, "stop") if self._stopping.is_set() else self.marks.cancelled(st, key[0])
        if cancelled is not None or self.intake.forgotten(key):
            if self.cancellation.late_fragment(key, without_convention(md), st, fragment.seq, cancelled):
                return
        limit = self.settings.max_fragment_chars
        try:
            text = decode_text_value(value)
            if len(text) > limit:
                fragment.error = (f"a fragment of {len(text)} characters (PRIMESPEECH_MAX_FRAGMENT_CHARS={limit})")
            elif not self.intake.room(len(text)):
                fragment.error = (f"the intake holds {self.settings.max_intake_chars} characters "
                                  "(PRIMESPEECH_MAX_INTAKE_CHARS)")
            else:
                fragment.text = text
        except Exception as exc:  # noqa: BLE001 - a bad fragment is left out; its utterance goes on
            self.log("WARNING", f"fragment of session {key[0]!r} segment {key[1]!r} left out: "
                                f"{type(exc).__name__}: {exc}")
        self.intake.put_fragment(key, without_convention(md), st, fragment)

    def _on_control(self, value: Any, md: dict, st: Stamp | None = None) -> None:
        if convention(md)[3]:  # flush: true on a control: a barge-in, then the command (if any)
            if not self._stopping.is_set():
                self.cancellation.barge_in(md, st, None)
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
            self.cancellation.reset(md, st)
        elif command.name == "cancel":  # one session's texts and utterances; the others go on
            session = command.arg if command.arg is not None else md.get("session_id")
            if session is None:
                error = "cancel needs a session: a session_id in the control's metadata, or cancel:SESSION"
                self.log("ERROR", error)
                self.status("error", md, level="ERROR", message=error, error=error, command="cancel")
            else:
                self.cancellation.cancel_session(str(session), md, st)
        elif command.name == "change_voice":  # through the intake: behind the texts that arrived before it
            self.intake.put_control(Job("control", md, command=command, stamp=st))
        elif not self.ready.is_set():  # the start-up: answered by the worker once the engine is built, first
            self.jobs.put(Job("control", md, command=command), front=True)
        elif self.engine is None:  # the start failed
            self.status("error", md, level="ERROR", message="not ready", error="not ready", command=command.name)
        elif command.name == "cleanup":  # on the worker, between two jobs: never stalls a text's audio
            self.jobs.put(Job("control", md, command=command), front=True)
        else:
            self._run_control(command, md)

    # -- worker ---------------------------------------------------------------------------------------
    def _run_job(self, job: Job) -> None:
        if job.kind == "text":
            self.speaker.run(job)
        elif job.command.name == "set_parameter":
            message = self.params.apply(job.command, self)
            self.log("INFO", f"parameter {message}")
            self.status("parameter_set", job.metadata, message=message, parameter=job.command.key,
                        value=job.command.value, parameters=self.params.current(self.settings))
        elif job.command.name == "change_voice":
            controls.change_voice(job.command.arg, job.metadata, job.stamp, self.voices, self.engine, self.jobs,
                                  self.status, self.log)
        else:
            self._run_control(job.command, job.metadata)

    def _run_control(self, cmd, md: dict) -> None:
        controls.answer(cmd, md, self.engine, self.voice, self.counts.snapshot(),
                        self.jobs.pending() + self.intake.queued_texts(), self.status, self.log,
                        self.counts.sessions_snapshot())
