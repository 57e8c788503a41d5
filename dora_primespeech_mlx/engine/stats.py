"""Timings and counters: :class:`Timer` (one request's stage seconds), :func:`stage` (times a stage and turns an
unexpected failure into :class:`SynthesisError` naming the stage) and :class:`EngineStats` (the running totals
behind ``engine.stats()``, thread-safe on their own lock). :func:`recording_spans` collects every stage's
interval and thread for the bench's per-core timeline."""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from dataclasses import dataclass, field

from ..errors import NothingToSpeakError, PrimeSpeechError, SynthesisCancelled, SynthesisError
from ..text.errors import TextFrontendError

COUNTERS = ("requests", "streams", "failures", "skipped", "cancelled", "chunks", "tokens")


@dataclass
class Timer:
    timings: dict[str, float] = field(default_factory=dict)

    def add(self, stage: str, seconds: float) -> None:
        self.timings[stage] = self.timings.get(stage, 0.0) + seconds


_spans: list[tuple[str, int, float, float]] | None = None  # (stage, native thread id, start, end) while recording


@contextlib.contextmanager
def recording_spans():
    """Collect ``(stage, native thread id, start, end)`` (``time.perf_counter`` seconds) of every stage that
    ends inside the block, from every thread (``bench --timeline``). Off otherwise: a stage then costs one
    global read more."""
    global _spans
    out: list[tuple[str, int, float, float]] = []
    _spans = out
    try:
        yield out
    finally:
        _spans = None


@contextlib.contextmanager
def stage(name: str, timer: Timer | None = None, key: str | None = None):
    """Time stage ``name`` into ``timer`` (under ``key`` when given) and turn unexpected failures into
    :class:`SynthesisError`."""
    t0 = time.perf_counter()
    try:
        yield
    except (PrimeSpeechError, TextFrontendError, GeneratorExit, KeyboardInterrupt):
        raise
    except Exception as exc:
        raise SynthesisError(f"{name} stage failed: {type(exc).__name__}: {exc}", stage=name) from exc
    finally:
        t1 = time.perf_counter()
        if timer is not None:
            timer.add(key or name, t1 - t0)
        spans = _spans
        if spans is not None:
            spans.append((key or name, threading.get_native_id(), t0, t1))


class EngineStats:
    """Request counts, audio seconds and per-stage timing totals of one engine."""

    def __init__(self):
        self._lock = threading.Lock()
        self._data = self._empty()

    @staticmethod
    def _empty() -> dict:
        return {**dict.fromkeys(COUNTERS, 0), "audio_seconds": 0.0, "reference_computations": 0, "timings": {}}

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._data[name] += n

    def failure(self, exc: BaseException) -> None:
        """Count a failed request (cancellations are counted where they happen)."""
        if not isinstance(exc, SynthesisCancelled):
            self.count("skipped" if isinstance(exc, NothingToSpeakError) else "failures")

    def begin(self, stream: bool) -> None:
        """Count a request as it starts; its outcome (failure, skipped, cancelled) is counted once where it
        happens, so no outcome count exceeds ``requests``."""
        with self._lock:
            self._data["requests"] += 1
            self._data["streams"] += int(stream)

    def record(self, timer: Timer, audio_seconds: float, tokens: int, chunks: int, stream: bool) -> None:
        """Add what a request produced (audio, tokens, stage timings); a request is counted by :meth:`begin`."""
        with self._lock:
            st = self._data
            st["chunks"] += chunks
            st["tokens"] += tokens
            st["audio_seconds"] += audio_seconds
            for name, seconds in timer.timings.items():
                total, n = st["timings"].get(name, (0.0, 0))
                st["timings"][name] = (total + seconds, n + 1)

    @contextlib.contextmanager
    def paused(self):
        """Run a block (the warm-up) without counting it; reference computations still count."""
        with self._lock:
            saved = copy.deepcopy(self._data)
        try:
            yield
        finally:
            with self._lock:
                saved["reference_computations"] = self._data["reference_computations"]
                self._data = saved

    def snapshot(self) -> dict:
        """Counts, audio and compute seconds, RTF and mean stage timings (per request that had the stage)."""
        with self._lock:
            st = copy.deepcopy(self._data)
        compute = st["timings"].get("total", (0.0, 0))[0]
        return {
            **{k: st[k] for k in COUNTERS},
            "audio_seconds": st["audio_seconds"],
            "compute_seconds": compute,
            "rtf": compute / st["audio_seconds"] if st["audio_seconds"] else None,
            "mean_timings": {k: total / n for k, (total, n) in st["timings"].items() if n},
            "reference_computations": st["reference_computations"],
        }
