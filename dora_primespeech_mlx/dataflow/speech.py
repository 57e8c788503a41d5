"""Speaking one text on the worker: resolve its voice (once), run the engine (streamed chunk by chunk, or whole),
send its audio and answer it (``completed``, ``skipped`` or ``error`` with the stage that failed). The texts
queued behind it are offered to the engine, which may batch them into the running decode: the speaker pushes them
onto the board the engine reads (:meth:`Speaker.publish`, whenever the queue changes), as the playback clock pushes
when the audio sent so far will have played; the engine never calls back into the node."""

from __future__ import annotations

import math
import time
from typing import Any

from ..errors import (
    ConfigError,
    NothingToSpeakError,
    PrimeSpeechError,
    SynthesisCancelled,
    SynthesisError,
    VoiceNotFoundError,
    VoiceNotInstalledError,
)
from .answers import Answers
from .cancellation import CANCELLED
from .jobs import Job
from .messages import TextRequest
from .params import Parameters
from .voices import Voices


class Speaker:
    """``engine`` is the engine (None until the worker built it); settings are read from ``answers.out.settings``;
    the board the engine reads is the playback clock's (``answers.out.clock.board``)."""

    def __init__(self, voices: Voices, answers: Answers, params: Parameters | None = None, engine: Any = None):
        self.engine, self.voices, self.answers = engine, voices, answers
        self.params = params if params is not None else Parameters()  # runtime parameters' request defaults
        self.out = answers.out
        self.board = self.out.clock.board

    def run(self, job: Job) -> None:
        """Speak ``job`` and answer it, once."""
        if job.answered:
            return
        if job.error is not None:
            self.answers.fail(job, job.error, job.error_stage)
            return
        req = job.request
        for w in req.warnings:
            self.out.log("WARNING", f"text #{job.seq}: {w}")
        text = req.text
        if job.skip:
            self.answers.skip(job, f"nothing to speak: no letters or digits in {text[:40]!r}", "DEBUG")
            return
        try:
            voice = self.voice_of(job)
        except (VoiceNotFoundError, VoiceNotInstalledError, ConfigError) as exc:
            self.answers.fail(job, str(exc), "voice")
            return
        overrides = self.params.request(req.overrides)
        language = overrides.get("text_lang") or voice.language
        where = {} if job.utterance is None else {"sentence": job.part}
        self.out.status("synthesizing", job.metadata, seq=job.seq, voice=voice.name, language=language,
                        characters=len(text), **where)
        t0 = time.perf_counter()
        try:
            duration, chunks, timings = self._synthesize(job, text, voice, language, req, overrides)
        except SynthesisCancelled:
            duration = chunks = 0
        except NothingToSpeakError as exc:
            self.answers.skip(job, *skip_reason(exc, language, "text_lang" in overrides, voice.language))
            return
        except SynthesisError as exc:
            stage = getattr(exc, "stage", "synthesis")
            self.answers.fail(job, request_voice_error(req, exc, stage) or str(exc), stage)
            return
        except (PrimeSpeechError, ValueError) as exc:  # text front end, bad request parameters
            self.answers.fail(job, f"{exc}", "text" if type(exc).__module__.endswith("text.errors") else "request")
            return
        if job.cancel.is_set():
            self.answers.fail(job, job.error or CANCELLED, job.error_stage if job.error else "reset")
            return
        elapsed = time.perf_counter() - t0
        if job.answered:  # a reset answered it while its last audio went out
            return
        if self.out.settings.log_timing:
            self._log_timing(job, voice, duration, chunks, elapsed, timings)
        self.answers.complete(job, "completed", status=("done", dict(
            seq=job.seq, voice=voice.name, duration=round(duration, 3), elapsed=round(elapsed, 3), chunks=chunks,
            **where)))

    def _log_timing(self, job: Job, voice, duration: float, chunks: int, elapsed: float, timings: dict) -> None:
        rtf = elapsed / duration if duration > 0 else math.inf
        detail = ", ".join(f"{k} {v:.2f}s" for k, v in (timings or {}).items() if isinstance(v, (int, float)))
        self.out.log("INFO", f"text #{job.seq}: {duration:.2f} s of audio in {elapsed:.2f} s (RTF {rtf:.2f}), "
                             f"{chunks} chunk(s), voice {voice.name}" + (f"; {detail}" if detail else ""))

    def _synthesize(self, job: Job, text: str, voice, language: str, req: TextRequest, overrides: dict):
        """(seconds of audio sent, chunks sent, the engine's timings)."""
        overrides = engine_overrides(overrides)
        total, n, timings = 0.0, 0, {}
        engine = self.engine
        if self.out.settings.streaming:
            for chunk in engine.synthesize_stream(text, voice=voice, cancel=job.cancel,
                                                  listener=self.board.listener(job.seq), **overrides):
                if job.cancel.is_set():
                    break
                total += self.out.audio(job, chunk.audio, chunk.sample_rate, voice, language,
                                        chunk.chunk_index, bool(chunk.is_final), True, req.volume,
                                        chunk_span(chunk, len(text)),
                                        bool(getattr(chunk, "sentence_end", chunk.is_final)))
                n += 1
            return total, n, timings
        result = engine.synthesize(text, voice=voice, cancel=job.cancel, **overrides)
        if job.cancel.is_set():
            return 0.0, 0, {}
        total = self.out.audio(job, result.audio, result.sample_rate, voice, language, 0, True, False, req.volume)
        return total, 1, dict(getattr(result, "timings", {}) or {})

    def publish(self, queued: list[Job]) -> None:
        """Push the texts ``queued`` (the jobs waiting, in order) onto the board the engine's streams read (none until
        the engine is built, a voice resolves against the engine's first one, nor while the node does not stream)."""
        streams = self.engine is not None and self.out.settings.streaming
        self.board.update(self.upcoming(queued) if streams else [])

    def upcoming(self, queued: list[Job]) -> list:
        """The texts of ``queued`` right behind the one being spoken, as the worker will ask the engine for them (its
        continuous batching lets them join the running decode; engine/batching.py). Up to the first control job
        (a ``change_voice`` keeps its place); texts that will fail or be skipped are left out."""
        from ..engine.batching import Upcoming

        out = []
        for job in queued:
            if job.kind != "text":
                break
            req = job.request
            if job.answered or job.error is not None or job.skip or req is None or job.cancel.is_set():
                continue
            try:
                voice = self.voice_of(job)
            except Exception:  # noqa: BLE001 - its own turn reports it
                continue
            out.append(Upcoming(job.seq, req.text, voice, engine_overrides(self.params.request(req.overrides)),
                                job.cancel))
        return out

    def voice_of(self, job: Job):
        """The voice ``job`` is spoken with, resolved once (a ``change_voice`` that runs clears it)."""
        if job.voice is None:
            job.voice = self.voices.for_request(job.request, job.stamp)
        return job.voice


def skip_reason(exc: NothingToSpeakError, language: str, text_sets_it: bool, voice_language: str) -> tuple[str, str]:
    """(reason, log level) of a text the engine found nothing to speak in. Letters the language cannot read (a
    Chinese answer to an English voice) are a WARNING that says what to do; no letters or digits at all, DEBUG."""
    if exc.language is None:
        return f"nothing to speak: {exc}", "DEBUG"
    whose = "the text's language" if text_sets_it else "the voice's language"
    hint = ("send it with its own `language` or `auto`" if text_sets_it
            else "set `language` on the text (or TEXT_LANG) to its own or `auto`")
    if text_sets_it and language != voice_language:
        whose += f" (the voice's: {voice_language!r})"
    return f"nothing speakable as {exc.language!r}, {whose}: {hint}", "WARNING"


def engine_overrides(overrides: dict) -> dict:
    """A text's settings for the engine. The dataflow owns the LLM text stage (``PRIMESPEECH_LLM_TEXT``): the
    intake ran it once, per session and across messages (:mod:`.intake`, :mod:`.sentences`), so the engine, which
    runs it by default for its direct callers, is told not to run it again (``llm_text=False``)."""
    return {**overrides, "llm_text": False}


def request_voice_error(req: TextRequest, exc: BaseException, stage: str) -> str | None:
    """For a voice built from a request's paths that fails to load: a message without the loader's details, which
    may quote the file (its first bytes, say). None for every other failure (reported as it is)."""
    if stage not in ("load", "reference") or req.voice is None or req.voice.kind not in ("custom", "trained"):
        return None
    cause = type(exc.__cause__).__name__ if exc.__cause__ is not None else type(exc).__name__
    return (f"VOICE:{req.voice.kind.upper()}: the files it names cannot be loaded as a voice ({cause}; the node's "
            "operator can run `primespeech-mlx convert` on them to see why)")


def chunk_span(chunk, n: int) -> tuple[int, int]:
    """The engine's text span of a streamed chunk of a text of ``n`` characters (an engine that gives none: the
    whole text on its first chunk, an empty span at its end on the others)."""
    start, end = getattr(chunk, "text_start", None), getattr(chunk, "text_end", None)
    if not isinstance(start, int) or not isinstance(end, int):
        return (0, n) if chunk.chunk_index == 0 else (n, n)
    return start, end
