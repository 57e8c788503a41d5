"""This engine's measured speeds (:class:`StreamRates`), shared by its requests: what a stream's pacer
(engine/pacing.py) plans with and what the streams and whole requests add to as they run. The rules and their
measurements: docs/streaming.md ("Paced windows")."""

from __future__ import annotations

import collections
import statistics
import threading

RECENT = 9  # a speed is the median of this many recent measurements (robust to a stray slow one)
KINDS = ("token_s", "frame_s", "latent_s")
SLOWDOWN_MAX = 2.0  # the measured slowdown never exceeds this (windows twice as slow as estimated)
LIVE_MAX = 2.0  # the live speed is taken at most this much slower than the recent medians (never faster: a
# sentence's first tokens are its cheapest, its KV cache still short; the medians follow a faster machine)
STEP_GROWTH = {2: 1.7, 3: 2.0, 4: 2.2}  # a decode step of this many rows against a step alone, until measured
# (the bench's figures, docs/performance.md#sentences-decoded-together-continuous-batching); wider, in proportion to
# the rows beyond four


class _Speeds:
    """The speeds measured at one thread count (:class:`StreamRates`)."""

    def __init__(self):
        self.seen: dict[str, collections.deque] = {k: collections.deque(maxlen=RECENT) for k in KINDS}
        self.from_windows: set[str] = set()  # the kinds measured on a stream window (whole sentences then ignored)
        self.errors: collections.deque = collections.deque(maxlen=RECENT)  # windows' measured / estimated seconds
        self.starts: dict[str, collections.deque] = {}  # a sentence's prefill seconds, BERT seconds per phone
        self.steps: dict[int, collections.deque] = {}  # by rows: the seconds of a decode step of that many rows


class StreamRates:
    """This engine's speeds, shared by its requests (the speeds are the machine's): each the median of the
    :data:`RECENT` latest measurements, None until measured. ``token_s``: GPT decode seconds per token; ``frame_s``:
    vocoder seconds per latent frame (until a window was measured, a whole sentence's); ``latent_s``: SoVITS up to
    the vocoder, seconds per stream window (until a window was measured, a whole sentence's, which is larger: a
    conservative estimate). The engine reports only measurements taken while the vocoder lane was idle (beside it
    everything is slower, and a stream's first window never has it beside it), and GPT seconds only where each token
    took a step alone, but for one cautious stand-in: until such a step was measured, the batched steps of a whole
    request's first sentence (slower than steps alone).

    Speeds are kept per thread count (:meth:`use`: the engine's thread plan decides one per request, threads.py): a
    request at one thread beside a co-tenant plans with one thread's speeds, not those of the idle two-thread
    warm-up. Where the count in use has no measurement of a speed yet, the nearest count's stands in, taken as many
    times slower as that count has more threads (work spread over n threads done by fewer: the safe side; never
    faster where it has fewer); the first request at a new count then measures its own. The sentence lengths are
    the voice's, at any count."""

    def __init__(self):
        self._lock = threading.Lock()
        self._count: int | None = None  # the thread count in use (None: never told, one set of speeds)
        self._by_count: dict[int | None, _Speeds] = {None: _Speeds()}
        self._lengths: dict[str, collections.deque] = {}  # per voice: its sentences' tokens per phone

    def use(self, threads: int | None) -> None:
        """The requests from now on run on ``threads`` threads (the engine's thread plan); None: one count."""
        with self._lock:
            self._count = threads
            self._by_count.setdefault(threads, _Speeds())

    @property
    def threads(self) -> int | None:
        return self._count

    @property
    def _now(self) -> _Speeds:  # (under the lock)
        return self._by_count[self._count]

    def _pick(self, read) -> float | None:
        """``read(speeds)`` (a median, or None) at the count in use, else at the nearest count that has it, scaled
        to this count (see the class docstring). Under the lock."""
        value = read(self._now)
        if value is not None:
            return value
        here = self._count
        others = [(abs((c or 1) - (here or 1)), c) for c, sp in self._by_count.items() if c != here]
        for _, c in sorted(others, key=lambda o: (o[0], -(o[1] or 0))):
            value = read(self._by_count[c])
            if value is not None:
                return value * max(1.0, (c or 1) / (here or 1))
        return None

    def _add(self, kind: str, value: float) -> None:
        with self._lock:
            self._now.seen[kind].append(value)

    def _median(self, kind: str) -> float | None:
        with self._lock:
            return self._pick(lambda sp: statistics.median(sp.seen[kind]) if sp.seen[kind] else None)

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

    def note_step(self, rows: int, seconds: float) -> None:
        """One decode step of ``rows`` rows took ``seconds`` (nothing beside it); one row: the GPT's speed alone
        (:meth:`note_tokens`)."""
        if rows == 1:
            self.note_tokens(seconds, 1)
        elif rows > 1 and seconds > 0:
            with self._lock:
                self._now.steps.setdefault(rows, collections.deque(maxlen=RECENT)).append(seconds)

    def step_s(self, rows: int) -> float | None:
        """Seconds of a decode step of ``rows`` rows: one row, :attr:`token_s`; more, the median of the recent ones,
        until one was measured a step alone times :data:`STEP_GROWTH`; None before any speed was measured. Each of a
        stream's tokens takes one step of all the rows decoding beside it."""
        with self._lock:
            seen = list(self._now.steps.get(rows, ()))
        if seen:
            return statistics.median(seen)
        alone = self.token_s
        if alone is None or rows <= 1:
            return alone
        return alone * STEP_GROWTH.get(rows, STEP_GROWTH[4] * rows / 4)

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
            now = self._now
            if window and kind not in now.from_windows:  # whole sentences were only a stand-in
                now.seen[kind].clear()
                now.from_windows.add(kind)
            if window or kind not in now.from_windows:
                now.seen[kind].append(value)

    @property
    def latent_from_windows(self) -> bool:
        with self._lock:
            return "latent_s" in self._now.from_windows

    def note_window(self, seconds: float, estimated: float) -> None:
        """A paced window's seconds (its GPT tokens and SoVITS, nothing beside it) against the pacer's estimate."""
        if seconds > 0 and estimated > 0:
            with self._lock:
                self._now.errors.append(seconds / estimated)

    @property
    def slowdown(self) -> float:
        """How much longer than estimated recent windows took at the count in use (the median of the last
        :data:`RECENT`: a bias, not the noise the safety margins cover), 1 at least, at most :data:`SLOWDOWN_MAX`:
        the pacer plans with the speeds this much slower (a throttled or shared machine gets larger windows and a
        larger first piece, measured, instead of gaps)."""
        with self._lock:
            seen = list(self._now.errors)
        return min(SLOWDOWN_MAX, max(1.0, statistics.median(seen))) if seen else 1.0

    def note_start(self, kind: str, seconds: float, phones: int = 1) -> None:
        """A sentence's work before its first token: ``prefill`` (its GPT prefill, seconds) or ``bert`` (BERT
        features for ``phones`` phones)."""
        if seconds > 0 and phones > 0:
            with self._lock:
                self._now.starts.setdefault(kind, collections.deque(maxlen=RECENT)).append(seconds / phones)

    def start_s(self, kind: str) -> float:
        """The median of :meth:`note_start`'s recent ``kind`` seconds (per phone for ``bert``); 0 before one."""
        with self._lock:
            value = self._pick(lambda sp: statistics.median(sp.starts[kind]) if sp.starts.get(kind) else None)
        return value or 0.0

    def note_length(self, voice: str, tokens: int, phones: int) -> None:
        """A sentence of ``phones`` target phones decoded to ``tokens`` semantic tokens by ``voice``."""
        if tokens > 0 and phones > 0:
            with self._lock:
                self._lengths.setdefault(voice, collections.deque(maxlen=RECENT)).append(tokens / phones)

    def expected_tokens(self, voice: str, phones: int) -> int | None:
        """How many tokens ``voice`` is likely to decode for a sentence of ``phones`` phones (the median of its
        recent sentences' tokens per phone), None before one was measured."""
        with self._lock:
            seen = list(self._lengths.get(voice, ()))
        return max(1, round(statistics.median(seen) * phones)) if seen and phones > 0 else None

    def live_ratio(self, seconds: float, tokens: int) -> float | None:
        """How many times slower than :attr:`token_s` a stream's ``tokens`` tokens just took ``seconds`` (1 to
        :data:`LIVE_MAX`; not kept), None where nothing can be said."""
        token_s = self.token_s
        if not token_s or seconds <= 0 or tokens <= 0:
            return None
        return min(LIVE_MAX, max(1.0, seconds / tokens / token_s))

    def known(self) -> bool:
        return None not in (self.token_s, self.frame_s, self.latent_s)

    def as_dict(self) -> dict[str, float | None]:
        return {**{k: self._median(k) for k in KINDS}, "slowdown": self.slowdown, "threads": self._count}
