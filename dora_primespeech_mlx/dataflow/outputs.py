"""What the node sends, through a transport (``send(id, array, metadata)``): ``log`` and ``status`` messages, the
``audio`` of a text (never a non-finite sample, never after the text's answer, the first one after a barge-in
marked ``flush: true``), the silence that stands in for a text without audio, and the ``segment_complete``
answers (retried, counted). Deciding *which* answer a text gets is :mod:`.answers`'s job."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from ..errors import SynthesisError
from ..settings import LOG_LEVELS, Settings
from .cancellation import CANCEL_STAGES
from .clock import PlaybackClock
from .utterance import Heard, Utterance, session_of, without_convention

NODE_NAME = "primespeech"
SEND_TRIES = 3
SILENCE_S = 0.05  # the silent audio answering a skipped or failed text (SILENCE_ON_SKIP)
SAMPLE_RATE = 32000  # of that silence when no voice is loaded yet (the models' rate)
SESSION_COUNTS = ("answered", "completed", "skipped", "errors", "cancelled")  # per session (stats: sessions)
MAX_SESSIONS = 64
COUNT_NAMES = ("texts", "completed", "skipped", "errors", "cancelled", "busy", "worker_restarts", "utterances",
               "sentences", "received", "fragments", "answered")  # received/fragments: text inputs as dora hands
# them over (plain texts, fragments); answered: segment_complete sent (a loss shows as received > answered)


class Counts(dict):
    """The node's counters (``stats`` reports them), each update under one lock; and per session (the last
    :data:`MAX_SESSIONS` seen): its answers by outcome and the seconds of audio sent."""

    def __init__(self):
        super().__init__({name: 0 for name in COUNT_NAMES})
        self._lock = threading.Lock()
        self.sessions: OrderedDict[str, dict] = OrderedDict()

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self[name] += n

    def snapshot(self) -> dict:
        with self._lock:
            return dict(self)

    def session(self, session: str, name: str, n: float = 1) -> None:
        """Count ``n`` of ``name`` (an outcome, ``cancelled`` or ``audio_s``) for ``session``."""
        with self._lock:
            counts = self.sessions.pop(session, None) or {**{k: 0 for k in SESSION_COUNTS}, "audio_s": 0.0}
            counts[name] += n
            self.sessions[session] = counts
            while len(self.sessions) > MAX_SESSIONS:
                self.sessions.popitem(last=False)

    def sessions_snapshot(self) -> dict:
        """The per-session counts, as ``stats`` reports them."""
        with self._lock:
            return {k: {**v, "audio_s": round(v["audio_s"], 3)} for k, v in self.sessions.items()}


class Outputs:
    """The node's sending side. ``settings`` is read at each send (the handler may replace it); ``voices.current``
    is the current voice (named on the silence)."""

    def __init__(self, settings: Settings, transport, counts: Counts, clock: PlaybackClock,
                 voices):
        self.settings = settings
        self.transport = transport
        self.counts = counts
        self.clock = clock
        self.voices = voices
        self._flush_next = False  # the next audio carries flush: true
        self._lock = threading.Lock()  # the flush flag
        self._warned_rate = False

    def send(self, output: str, array: pa.Array, metadata: dict) -> None:
        self.transport.send(output, array, metadata)

    def log(self, level: str, message: str) -> None:
        """Print ``message`` to stderr and send it on ``log``, if ``level`` is at least LOG_LEVEL."""
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
        """One ``status`` message: a JSON body with ``fields``, the request's ``metadata`` echoed."""
        body = {"status": status, "node": NODE_NAME, "level": level, "message": message or status,
                "timestamp": int(time.time()), **fields}
        self.send("status", pa.array([json.dumps(body, ensure_ascii=False, default=str)]), dict(metadata or {}))

    def answer(self, metadata: dict, outcome: str, error: str | None, stage: str | None, what: str) -> None:
        """One ``segment_complete`` (``outcome``; an error carries ``error`` and ``error_stage``; a skipped or failed
        text its ``reason``: the skip's, the error), counted and tried :data:`SEND_TRIES` times; ``what`` names the
        text or utterance in the report of a failed send."""
        md = dict(metadata)
        if outcome == "error":
            md.update(session_status="error", error=error or "error", error_stage=stage or "synthesis")
        if outcome != "completed":
            md["reason"] = error or ("error" if outcome == "error" else "nothing to speak")
        self.counts.add("errors" if outcome == "error" else outcome)
        session = session_of(md)
        self.counts.add("answered")
        self.counts.session(session, "answered")
        self.counts.session(session, ("cancelled" if stage in CANCEL_STAGES else "errors") if outcome == "error"
                            else outcome)
        for attempt in range(SEND_TRIES):
            try:
                self.send("segment_complete", pa.array([outcome]), md)
                return
            except Exception as exc:
                print(f"[{NODE_NAME}] ERROR segment_complete of {what} not sent (try {attempt + 1}): "
                      f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)

    def flush_next(self, announce: Callable[[], None] | None = None) -> None:
        """A barge-in: the next ``audio`` carries ``flush: true``. ``announce`` (the ``flush`` status) is sent under
        the same lock as every audio, so the first audio sent after it is the one that carries the mark."""
        with self._lock:
            self._flush_next = True
            if announce is not None:
                announce()

    def emit_audio(self, audio: np.ndarray, md: dict) -> None:
        """Send one ``audio`` message; the first after a barge-in carries ``flush: true``."""
        array = pa.array(audio) if self.settings.audio_format == "flat" else pa.array([audio])
        with self._lock:  # (marked and sent in one step: never a plain audio between the mark and its status)
            if self._flush_next:
                md["flush"], self._flush_next = True, False
            self.send("audio", array, md)

    def audio(self, job, audio, sample_rate: int, voice, language: str, index: int, final: bool, streaming: bool,
              volume: float | None, span: tuple[int, int] | None = None, sentence_end: bool = False) -> float:
        """Send one chunk of ``job``'s audio (unless the job was answered meanwhile); its duration in seconds.
        ``span``: the engine's span of the job's text this chunk starts (None: the whole text), ``sentence_end``:
        the chunk ends one of the engine's sentences. Raises :class:`SynthesisError` (nothing sent) for NaN or inf
        samples."""
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
                md = audio_metadata(job, final)
                md.update(sample_rate=sample_rate, duration=float(duration), voice=str(voice.name),
                          language=str(language), chunk_index=int(index), fragment_num=int(index) + 1,
                          is_final=bool(final), is_streaming=bool(streaming))
                heard, start, end, sentence, done = spoken(job, span, final, sentence_end if streaming else True)
                md.update(text=heard.joined()[start:end], text_start=int(start))  # (its end: start + len(text))
                self.emit_audio(audio, md)
                self.clock.sent(duration)
                self.counts.session(session_of(md), "audio_s", duration)
                heard.sent(start, end, duration, sentence, done)
        return duration

    def silence(self, job, utterance: Utterance | None = None, always: bool = False) -> None:
        """SILENCE_ON_SKIP: one short silent ``audio`` message for a text (or an utterance) that produced no
        audio (sent by the caller that claimed it); ``always``: also without SILENCE_ON_SKIP (the ``fin`` chunk
        that closes an utterance whose last audio went out before its end was known)."""
        if not (self.settings.silence_on_skip or always):
            return
        voice = self.voices.current
        rate = SAMPLE_RATE
        if utterance is not None:
            md = {**utterance.metadata, **utterance.chunk_metadata(True, None)}
            at = utterance.heard.sent_to  # no text: an empty span where the utterance's spoken text ends so far
        else:
            md = without_convention(job.metadata)
            at = 0
        md.update(text="", text_start=at)
        md.update(sample_rate=rate, duration=SILENCE_S, voice=str(getattr(voice, "name", "")),
                  language=str(getattr(voice, "language", "")), chunk_index=0, fragment_num=1, is_final=True,
                  is_streaming=bool(self.settings.streaming), silent=True)
        audio = np.zeros(int(rate * SILENCE_S), dtype=np.float32)
        try:
            self.emit_audio(audio, md)
        except Exception as exc:
            what = f"text #{job.seq}" if job is not None else f"segment {utterance.key[1]!r}"
            self.log("ERROR", f"silent audio for {what} not sent: {type(exc).__name__}: {exc}")


def audio_metadata(job, final: bool) -> dict:
    """The text's metadata for its audio: a plain text's without the convention's per-message keys (``seq``
    here means the chunk number); a sentence's: its utterance's with the chunk's ``seq`` and ``fin``."""
    if job.utterance is None:
        return without_convention(job.metadata)
    return {**job.utterance.metadata, **job.utterance.chunk_metadata(final, job.part)}


def spoken(job, span: tuple[int, int] | None, final: bool, sentence_end: bool):
    """Where a chunk of ``job``'s audio lies in its text: (the :class:`.utterance.Heard` of the text or utterance,
    the chunk's span in it, the sentence it belongs to (None: the previous chunk's), whether it ends that
    sentence). ``span`` is the engine's, in the job's own text (None: all of it). A sentence of an utterance is one
    sentence whose first chunk's span starts where the audio sent before it ended (the white space between them,
    and a sentence before it that gave no audio, go with it) and which ends with the job's last chunk; a plain
    text's sentences are the engine's."""
    n = len(job.request.text)
    a, b = (0, n) if span is None else (max(0, min(int(span[0]), n)), max(0, min(int(span[1]), n)))
    utterance = job.utterance
    if utterance is not None:
        _, at, end = utterance.tiles[job.part] if job.part < len(utterance.tiles) else (0, 0, n)
        if a == 0 and b > 0:  # its first chunk: from where the audio sent before this sentence ended
            first = min(utterance.heard.sent_to, at)
            return utterance.heard, first, at + b, (first, end), bool(final)
        return utterance.heard, at + a, at + b, None, bool(final)
    if job.heard is None:
        job.heard = Heard(job.request.text)
    return job.heard, a, b, ((a, b) if b > a else None), bool(sentence_end or final)
