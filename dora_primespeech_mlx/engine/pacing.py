"""When a stream cuts its next window: this engine's measured speeds (:class:`StreamRates`) and the plan that
keeps a listener's buffer from running dry (:class:`Pacer`).

A window with ``n`` new tokens costs the SoVITS stages up to the vocoder (``latent_s``: about the same for every
window, the text encoder and the flow see context + new + lookahead tokens) plus the vocoder on the emitted frames
and its margins (``frame_s`` per latent frame); the GPT needs ``token_s`` per token, and each token is
``audio_per_token`` of audio (40 ms at speed 1). So a window adds ``n * audio_per_token`` to the listener's buffer
and takes ``cost(n) + n * token_s`` from it: it keeps up only if ``n`` is at least
``n* = overhead / (audio_per_token - token_s - vocoder_s_per_token)``, and only if the buffer already holds what
such a window takes (``B* = overhead + n* (token_s + vocoder_s_per_token)``); with a little more queued, each
window adds to the buffer and the next one can be larger.

The pacer therefore (``stream_pace``, on by default, once speeds were measured)

- starts a stream with ``stream_first_tokens`` tokens, or, where this machine is too slow for a small first
  piece to be followed without a gap, with enough that the first piece covers ``B*`` for a window
  :data:`GROWTH` times ``n*`` (then the first audio comes later, by design: one wait at the start instead of
  gaps in the middle); where no window size keeps up (slower than real time), the first piece has
  ``stream_first_tokens`` tokens and every later one ``stream_chunk_tokens``, also after the listener ran dry
  (the largest windows make the total wait the shortest);
- cuts each later window *just in time*: it waits for more tokens (larger windows, less overhead per second of
  audio) while one more token would still leave the window ready before the audio already sent has played,
  with a safety margin; never fewer than :data:`GROWTH` times ``n*``, never more than ``stream_chunk_tokens``.

Without measured speeds (the first stream of an engine that has not synthesised anything yet) or with
``stream_pace`` off, windows follow :func:`window_steps`."""

from __future__ import annotations

import collections
import math
import statistics
import threading
from collections.abc import Iterator

from ..models.sovits import FRAMES_PER_TOKEN
from .config import SynthesisConfig

RECENT = 9  # a speed is the median of this many recent measurements (robust to a stray slow one)
SAFETY_S = 0.05  # seconds kept in hand beyond the estimate ...
SAFETY_FRACTION = 0.15  # ... plus this share of the estimated window cost (machines are noisy)
KINDS = ("token_s", "frame_s", "latent_s")
GROWTH = 1.2  # the first piece feeds a window this much larger than the break-even size (so the buffer grows)


class StreamRates:
    """This engine's speeds, shared by its requests (the speeds are the machine's): each the median of the
    :data:`RECENT` latest measurements, None until measured. ``token_s``: GPT decode seconds per token; ``frame_s``:
    vocoder seconds per latent frame (until a window was measured, a whole sentence's); ``latent_s``: SoVITS up to
    the vocoder, seconds per stream window (until a window was measured, a whole sentence's, which is larger: a
    conservative estimate). The engine reports only measurements taken while the vocoder lane was idle (beside it
    everything is slower, and a stream's first window never has it beside it), and GPT seconds only where each token
    took a step alone, but for one cautious stand-in: until such a step was measured, the batched steps of a whole
    request's first sentence (slower than steps alone)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._seen: dict[str, collections.deque] = {k: collections.deque(maxlen=RECENT) for k in KINDS}
        self._from_windows: set[str] = set()  # the kinds measured on a stream window (whole sentences then ignored)

    def _add(self, kind: str, value: float) -> None:
        with self._lock:
            self._seen[kind].append(value)

    def _median(self, kind: str) -> float | None:
        with self._lock:
            seen = list(self._seen[kind])
        return statistics.median(seen) if seen else None

    @property
    def token_s(self) -> float | None:
        return self._median("token_s")

    @property
    def frame_s(self) -> float | None:
        return self._median("frame_s")

    @property
    def latent_s(self) -> float | None:
        return self._median("latent_s")

    def note_tokens(self, seconds: float, tokens: int) -> None:
        if tokens > 0 and seconds > 0:
            self._add("token_s", seconds / tokens)

    def note_vocoder(self, seconds: float, frames: int, window: bool = False) -> None:
        """A window's (``window``) or a whole sentence's vocoder seconds for ``frames`` latent frames. A whole
        sentence is a stand-in until a window is measured: per frame it is cheaper (no per-run overhead to share,
        and a long latent is cut over the cores: ``PRIMESPEECH_VOCODER_PARTS``)."""
        if frames > 0 and seconds > 0:
            self._note("frame_s", seconds / frames, window)

    def note_latent(self, seconds: float, window: bool) -> None:
        """A window's (``window``) or a whole sentence's SoVITS seconds up to the vocoder."""
        if seconds > 0:
            self._note("latent_s", seconds, window)

    def _note(self, kind: str, value: float, window: bool) -> None:
        with self._lock:
            if window and kind not in self._from_windows:  # whole sentences were only a stand-in
                self._seen[kind].clear()
                self._from_windows.add(kind)
            if window or kind not in self._from_windows:
                self._seen[kind].append(value)

    @property
    def latent_from_windows(self) -> bool:
        return "latent_s" in self._from_windows

    def known(self) -> bool:
        return None not in (self.token_s, self.frame_s, self.latent_s)

    def as_dict(self) -> dict[str, float | None]:
        return {k: self._median(k) for k in KINDS}


def window_steps(cfg: SynthesisConfig) -> Iterator[int]:
    """How many new tokens each window waits for without pacing: ``stream_first_tokens``, then from half of it
    chunks growing by ``stream_ramp`` per window up to ``stream_chunk_tokens`` (12, 9, 14, 21, 31, 40, 40, ...).
    ``stream_ramp`` 1: every later window waits for ``stream_chunk_tokens``."""
    yield cfg.stream_first_tokens
    step = min(cfg.stream_first_tokens, cfg.stream_chunk_tokens) / 2  # the second piece must be ready while the
    if cfg.stream_ramp <= 1:                                           # first (its tokens minus the lookahead) plays
        step = float(cfg.stream_chunk_tokens)
    while True:
        step = min(float(cfg.stream_chunk_tokens), step * cfg.stream_ramp)
        yield max(1, math.ceil(step))


class Pacer:
    """The window plan of one streamed request: :meth:`cut` says, after each new token, whether to cut a window.

    ``margin_frames``: latent frames vocoded beyond the emitted span on each side (``streaming.vocoder_margin``);
    ``crossfade_frames``: the crossfade's frames (vocoded again at each seam); ``frame_audio_s``: seconds of
    audio per latent frame at speed 1 (hop / sample rate)."""

    def __init__(self, cfg: SynthesisConfig, rates: StreamRates | None, speed: float, margin_frames: int,
                 crossfade_frames: int, frame_audio_s: float):
        self.cfg = cfg
        self.steps = window_steps(cfg)
        self.next_step: int | None = None
        self.paced = bool(cfg.stream_pace) and rates is not None and rates.known()
        self.frames_per_token = FRAMES_PER_TOKEN / speed
        self.audio_per_token = FRAMES_PER_TOKEN * frame_audio_s / speed
        lookahead = min(margin_frames, math.ceil(cfg.stream_lookahead_tokens * self.frames_per_token))
        self.extra_frames = margin_frames + crossfade_frames + lookahead
        self.rates = rates
        self.batched_token_s = 0.0  # the stream's recent seconds per token while other rows decode beside it
        self.token_s = self.frame_s = self.latent_s = 0.0
        self.n_min, self.first_tokens, self.sustainable = 1, cfg.stream_first_tokens, True
        if self.paced:
            self._plan()

    def _plan(self) -> None:
        """The sizes from the speeds measured so far (again at every decision: the windows of this stream
        update them)."""
        cfg, rates = self.cfg, self.rates
        self.token_s, self.frame_s, self.latent_s = rates.token_s, rates.frame_s, rates.latent_s
        self.token_s = max(self.token_s, self.batched_token_s)  # a batched step takes longer than a step alone
        per_token = self.token_s + self.frame_s * self.frames_per_token  # work per token, beside the overhead
        gain = self.audio_per_token - per_token  # audio gained per token of a window, net of its work
        overhead = self.latent_s + self.frame_s * self.extra_frames
        top = cfg.stream_chunk_tokens
        self.sustainable = gain > 0.02 * self.audio_per_token
        if not self.sustainable:  # slower than real time: no plan keeps up; the first audio as early as asked,
            self.n_min, self.first_tokens = top, cfg.stream_first_tokens  # then the largest windows
            return
        # windows of at least GROWTH times the break-even size n*: each adds audio to the buffer, so later windows
        # can grow with it (less overhead; the vocoder lane once 1.5 s are queued); the first piece covers one
        self.n_min = max(1, min(top, math.ceil(GROWTH * overhead / gain)))
        cost = self.cost(self.n_min)
        need = self.token_s * self.n_min + cost + SAFETY_S + SAFETY_FRACTION * cost  # queued when it is cut
        first = cfg.stream_lookahead_tokens + math.ceil(need / self.audio_per_token)
        self.first_tokens = max(cfg.stream_first_tokens, min(top, first))

    def cost(self, new_tokens: int) -> float:
        """Estimated seconds of a window emitting ``new_tokens`` tokens (SoVITS up to and with the vocoder)."""
        return self.latent_s + self.frame_s * (new_tokens * self.frames_per_token + self.extra_frames)

    def cut(self, new_tokens: int, now: float, deadline: float | None) -> bool:
        """Whether to cut a window now, ``new_tokens`` tokens after the previous cut (of this sentence).

        ``now``: the clock; ``deadline``: when the audio already sent will have been played (None before the
        stream's first audio)."""
        if not self.paced:
            if self.next_step is None:
                self.next_step = next(self.steps)
            if new_tokens < self.next_step:
                return False
            self.next_step = None
            return True
        self._plan()
        top = self.cfg.stream_chunk_tokens
        if new_tokens >= top:
            return True
        if deadline is None or (deadline <= now and self.sustainable):  # nothing is playing: a piece the listener
            return new_tokens >= self.first_tokens                       # can be kept fed after
        # slower than real time and the listener ran dry: the largest windows (n_min), which make the total wait
        # the shortest; small ones would spend the time on each window's overhead
        if new_tokens < self.n_min:
            return False
        estimate = self.cost(new_tokens + 1)  # the window if one more token is awaited ...
        ready = now + self.token_s + estimate  # ... is ready then
        return ready >= deadline - SAFETY_S - SAFETY_FRACTION * estimate
