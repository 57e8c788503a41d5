"""When a stream cuts its next window: the plan that keeps a listener's buffer from running dry (:class:`Pacer`), by
this engine's measured speeds (:class:`~.rates.StreamRates`, engine/rates.py; its names stay importable from here).

A window of ``n`` new tokens adds ``n * audio_per_token`` to the listener's buffer and costs the GPT's tokens, the
text encoder and flow (about the same for every window) and the vocoder on its frames, so it keeps up only above a
break-even size ``n*``, and only when the buffer already holds what such a window takes. The pacer
(``stream_pace``) starts with a first piece that covers that, cuts each later window just in time (larger windows,
less overhead), and *covers* where windows cannot gain on the listener (a machine about as fast as real time, or
slower): full windows, the last ones shrinking, after a first piece that lets the rest of the request play without
a gap. Without measured speeds, or with ``stream_pace`` off, windows follow :func:`window_steps`. The rules and
their measurements: docs/streaming.md ("Paced windows")."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

from .. import settings
from ..errors import ConfigError
from ..models.sovits.model import FRAMES_PER_TOKEN
from .config import SynthesisConfig
from .rates import KINDS, LIVE_MAX, RECENT, SLOWDOWN_MAX, STEP_GROWTH, StreamRates  # noqa: F401

SAFETY_S = 0.05  # seconds kept in hand beyond the estimate ...
SAFETY_FRACTION = 0.15  # ... plus this share of the estimated window cost (machines are noisy)
GROWTH = 1.2  # the first piece feeds a window this much larger than the break-even size (so the buffer grows)
LIVE_MIN_TOKENS = 4  # a sentence's own tokens since the last cut give its live speed from this many on
COVER_LATER_FRACTION = 0.55  # ... where a token's work is above this share of its audio (below: windows grow fast)
TAPER_SAFETY_S = 0.05  # seconds more in hand for each shrinking window (small windows' costs vary the most)
TAPER_HEADROOM = 1.25  # a shrinking plan ends this much after the expected length: a sentence up to 25 % longer
# than expected still keeps up (tests/engine/test_pacing.py); one that ends sooner only has more in hand
TAPERS = tuple((last, step) for last in (8, 12, 16, 24) for step in (3, 5, 7, 10))  # (last window, growth per
# window towards the front) that a covering plan tries; the one after which the first piece is smallest wins
STARTS = settings.STREAM_STARTS  # PacingOptions.start (PRIMESPEECH_STREAM_START)


@dataclasses.dataclass(frozen=True)
class PacingOptions:
    """The plan's choices (defaults: the engine's plan). Each field on is part of the default plan; tests and
    measuring tools build the options they compare instead of changing the code.

    ``taper``: while covering, a request's first sentence's last windows shrink (:meth:`Pacer.windows`).
    ``end_waits``: a window that would end at the sentence's expected length waits one step for its end.
    ``later_full``: while covering, a later sentence's first piece grows while the listener has audio in hand.
    ``cover_later``: windows that gain too little for the later sentences' starts cover as well.
    ``start``: ``"gapless"``, the request's first sentence plans for the later sentences too (its first piece may
    be larger so that their starts keep up); ``"earliest"``, where the listener waits for its first audio, it plans
    as if it were the request's only sentence (its first piece as early as it alone allows; a later sentence's
    start may then leave a gap).
    ``bert_first``: the request's first sentence gets its BERT features before the stream starts and the others
    after its first audio (off: every sentence's before the stream starts).
    ``join_while_covering``: waiting sentences join the decode even while the pacer counts on this sentence's
    steps alone (off in the default plan: they decode after it, as the plan has them).
    ``max_wait_s``: the longest the listener waits for audio, for its first piece or after it ran dry
    (``PRIMESPEECH_STREAM_MAX_WAIT``): a window is cut once waiting longer would exceed it, so an unavoidable wait
    is spent in gaps of at most this; 0 (off): the plan keeps every wait before the first audio.
    ``live``: the plan's speeds follow this sentence's own GPT tokens (:meth:`Pacer.live`)."""

    taper: bool = True
    end_waits: bool = True
    later_full: bool = True
    cover_later: bool = True
    start: str = "gapless"
    bert_first: bool = True
    join_while_covering: bool = False
    max_wait_s: float = 0.0
    live: bool = True

    @property
    def bert_upto(self) -> int | None:
        """How many sentences get their BERT features before the stream starts (None: all)."""
        return 1 if self.bert_first else None

    def __post_init__(self) -> None:
        if not (isinstance(self.max_wait_s, (int, float)) and 0 <= self.max_wait_s < math.inf):
            raise ConfigError(f"pacing max_wait_s={self.max_wait_s!r}: a number of seconds >= 0 "
                              "(PRIMESPEECH_STREAM_MAX_WAIT)")
        if self.start not in STARTS:
            raise ConfigError(f"pacing start={self.start!r} is invalid: use one of {', '.join(STARTS)} "
                              "(PRIMESPEECH_STREAM_START)")

    def plans_ahead(self, sentence: int, waiting: bool = True) -> bool:
        """Whether the pacer of the request's sentence ``sentence`` counts the sentences after it; ``waiting``: the
        listener has no audio in hand (the caller's earlier audio has played, or there is none)."""
        return sentence > 0 or self.start == "gapless" or not waiting


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

    The cost model: a window with ``n`` new tokens costs the SoVITS stages up to the vocoder (``latent_s``: about
    the same for every window, the text encoder and the flow see context + new + lookahead tokens) plus the vocoder
    on the emitted frames and its margins (``frame_s`` per latent frame); the GPT needs ``token_s`` per token, and
    each token is ``audio_per_token`` of audio (40 ms at speed 1). So a window adds ``n * audio_per_token`` to the
    listener's buffer and takes ``cost(n) + n * token_s`` from it: it keeps up only if ``n`` is at least
    ``n* = overhead / (audio_per_token - token_s - vocoder_s_per_token)``, and only if the buffer already holds
    what such a window takes (``B* = overhead + n* (token_s + vocoder_s_per_token)``); with a little more queued,
    each window adds to the buffer and the next one can be larger.

    The plan (once speeds were measured): the first piece is ``stream_first_tokens`` tokens, or, where this machine
    is too slow for a small first piece to be followed without a gap, enough to cover ``B*`` for a window
    :data:`GROWTH` times ``n*``; later windows are cut just in time, never below :data:`GROWTH` times ``n*`` nor
    above ``stream_chunk_tokens``. Where windows cannot grow enough to gain (``n*`` above ``stream_chunk_tokens``,
    or slower than real time) it *covers* (:attr:`covering`): windows of ``stream_chunk_tokens``, the last ones
    shrinking (:meth:`windows`, worked to :data:`TAPER_HEADROOM` beyond the expected length), after the smallest
    first piece that lets the rest of the request arrive without a gap (:meth:`_covering_first`); a later
    sentence's first piece grows to ``stream_chunk_tokens`` while the listener keeps audio
    (:attr:`PacingOptions.later_full`); lengths are expected from the phones (:meth:`StreamRates.expected_tokens`),
    and while it covers no other sentence joins the decode. It covers as well where a token's work is above
    :data:`COVER_LATER_FRACTION` of its audio and the later sentences need a larger first piece
    (:attr:`PacingOptions.cover_later`). A window that would end at the expected length waits one GPT step for the
    end-of-sequence token (:attr:`PacingOptions.end_waits`), so no window of no new tokens follows. The safety
    margin is :data:`SAFETY_S` plus :data:`SAFETY_FRACTION` of the estimated cost; where recent windows took longer
    than the speeds say (:attr:`StreamRates.slowdown`), the plan takes the speeds that much slower.

    ``margin_frames``: latent frames vocoded beyond the emitted span on each side (``streaming.vocoder_margin``);
    ``crossfade_frames``: the crossfade's frames (vocoded again at each seam); ``frame_audio_s``: seconds of
    audio per latent frame at speed 1 (hop / sample rate); ``expected_tokens``: the sentence's likely length
    (:meth:`StreamRates.expected_tokens`), None if unknown; ``after``: the request's later sentences, each as
    (expected tokens, seconds of work before its first token: prefill, BERT), where their lengths are expected;
    ``taper``: while covering, the last windows may shrink (:meth:`windows`; the engine: a request's first sentence,
    whose first audio the listener waits for; a later one's larger plan would make the wait between sentences
    longer); ``options``: the plan's choices (:class:`PacingOptions`, default the engine's plan)."""

    def __init__(self, cfg: SynthesisConfig, rates: StreamRates | None, speed: float, margin_frames: int,
                 crossfade_frames: int, frame_audio_s: float, expected_tokens: int | None = None,
                 after: list[tuple[int, float]] = (), taper: bool = True, options: PacingOptions | None = None,
                 wait_since: float | None = None):
        self.cfg = cfg
        self.wait_since = wait_since  # when the listener began waiting for the first audio (None: the first cut())
        self.live_ratio = 1.0  # this sentence's GPT seconds per token against the recent medians (live())
        self.error_slow = 1.0  # the windows' measured slowdown (StreamRates.slowdown), without the live ratio
        self.options = options if options is not None else PacingOptions()
        self.steps = window_steps(cfg)
        self.next_step: int | None = None
        self.paced = bool(cfg.stream_pace) and rates is not None and rates.known()
        self.frames_per_token = FRAMES_PER_TOKEN / speed
        self.audio_per_token = FRAMES_PER_TOKEN * frame_audio_s / speed
        lookahead = min(margin_frames, math.ceil(cfg.stream_lookahead_tokens * self.frames_per_token))
        self.extra_frames = margin_frames + crossfade_frames + lookahead
        self.rates = rates
        self.batched_token_s = 0.0  # the stream's recent seconds per token while other rows decode beside it
        self.rows = 1  # the rows decoding now, the stream's own included (each of its tokens takes a step of all)
        self.token_s = self.frame_s = self.latent_s = 0.0
        self.slow = 1.0  # the measured slowdown the plan applies (StreamRates.slowdown)
        self.expected_tokens = expected_tokens
        self.after = list(after)
        self.done = 0  # the sentence's tokens in the windows cut so far
        self.n_min, self.first_tokens, self.sustainable = 1, cfg.stream_first_tokens, True
        self.covering = False  # the first piece covers the rest of the request (windows cannot gain on the listener)
        self.tail: tuple[int, int] | None = None  # while covering: how a sentence's windows shrink (windows())
        self._tail_for: int | None = None  # the tokens done when the tail was chosen (None: not chosen)
        self._first_for: tuple | None = None  # what first_tokens was computed for while covering
        self._short: bool | None = None  # windows could gain, but the request's later sentences need a cover
        self.taper = taper
        if self.paced:
            self._plan()

    def _plan(self) -> None:
        """The sizes from the speeds measured so far (again at every decision: the windows of this stream
        update them)."""
        cfg, rates = self.cfg, self.rates
        self.error_slow = rates.slowdown  # recent windows took this much longer than estimated: slower speeds ...
        self.slow = slow = self.error_slow * self.live_ratio  # ... and this sentence's tokens, the speed it has now
        self.token_s, self.frame_s, self.latent_s = rates.token_s * slow, rates.frame_s * slow, rates.latent_s * slow
        self.token_s = max(self.token_s, self._step_s(self.rows), self.batched_token_s)  # a batched step takes longer
        per_token = self.token_s + self.frame_s * self.frames_per_token  # work per token, beside the overhead
        top = cfg.stream_chunk_tokens
        n_star = self._n_star(self.token_s)
        self.sustainable = n_star < math.inf
        left = self._end() - self.done  # the sentence's tokens still to come, as expected (or planned)
        if (n_star <= top and self._short is None and self.done == 0 and self.after and left > 0
                and self.options.cover_later):
            # windows can gain, but too little to build, before this sentence ends, the audio the listener needs
            # while the next sentences' prefill, BERT and first pieces run: where a first piece that covers the
            # request must be larger than one that covers this sentence alone (decided once, at its start)
            first = max(cfg.stream_first_tokens, self._feeding(max(1, math.ceil(n_star))))
            self._short = (per_token > COVER_LATER_FRACTION * self.audio_per_token
                           and self._covering_first(left, exact=False) > first)
        cover = n_star > top or bool(self._short)
        # windows cannot grow enough to gain on the listener (slower than real time, or n* above the largest
        # window), or the later sentences need more than they gain: the largest windows, after a first piece
        # that covers what they lose over the rest of the sentence, where its length is expected
        self.covering = cover and left > 0
        if cover:
            self.n_min = top
            if not self.covering or not self.options.taper or not self.taper:
                self.tail, self._tail_for = None, None
            elif self._tail_for is None:  # the shrinking of the last windows after which the first piece is the
                self._tail_for = self.done  # smallest (chosen once: the sentence's windows follow it); ties: fewer
                longer = math.ceil(self.expected_tokens * TAPER_HEADROOM) - self.done
                options = [(self._covering_first(longer, tail=t, exact=False), len(self.windows(longer, t)), t)
                           for t in TAPERS]
                first, _, tail = min(options, key=lambda o: o[:2])
                self.tail = tail if first < self._covering_first(left, tail=None, exact=False) else None
                left = self._end() - self.done
            if not self.covering:
                self.first_tokens = cfg.stream_first_tokens
            elif self._first_for != (key := (self.done, self.tail, self.token_s, self.frame_s, self.latent_s)):
                self._first_for, self.first_tokens = key, self._covering_first(left)  # (once per window and speeds)
            if self.sustainable and not self.covering:  # its length unknown: a first piece for the largest window
                self.first_tokens = max(cfg.stream_first_tokens, self._feeding(top))
            return
        # windows of at least GROWTH times the break-even size n*: each adds audio to the buffer, so later windows
        # can grow with it (less overhead; the vocoder lane once 1.5 s are queued); the first piece covers one
        self.n_min = max(1, math.ceil(n_star))
        self.first_tokens = max(cfg.stream_first_tokens, self._feeding(self.n_min))

    def _n_star(self, token_s: float) -> float:
        """:data:`GROWTH` times the break-even window n* with ``token_s`` seconds per token: windows of at least this
        many tokens gain on the listener; inf where a token's work is not 2 % below its audio (nothing gains)."""
        gain = self.audio_per_token - token_s - self.frame_s * self.frames_per_token  # per token, net of its work
        overhead = self.latent_s + self.frame_s * self.extra_frames
        return GROWTH * overhead / gain if gain > 0.02 * self.audio_per_token else math.inf

    def _step_s(self, rows: int) -> float:
        """Seconds of one of the stream's tokens with ``rows`` rows decoding (:meth:`StreamRates.step_s`, slowed
        as the plan's speeds are)."""
        return (self.rates.step_s(rows) or 0.0) * self.slow if rows > 1 else 0.0

    def admits(self, new_tokens: int, now: float, deadline: float | None, stall_s: float, rows: int,
               joining_tokens: int | None = None) -> bool:
        """Whether another sentence may join the decode now, so that ``rows`` rows step together from here on.

        It joins where, after its ``stall_s`` seconds (its front end, BERT and prefill, by the measured speeds), the
        stream's next tokens still arrive before the listener runs dry while the joining sentence decodes beside
        them: its ``joining_tokens`` (its expected length; ``stream_chunk_tokens`` where none is expected) or the
        rest of this sentence, whichever is longer (the rest to :data:`TAPER_HEADROOM` times the expected length: a
        sentence up to 25 % longer than expected; one window where none is expected, or it passed). Those tokens
        take the step time of ``rows`` rows each, in windows of ``stream_chunk_tokens`` (the fewest windows: the
        least overhead), the first holding the ``new_tokens`` decoded since the last cut; each window must be ready
        :data:`SAFETY_S` + :data:`SAFETY_FRACTION` of its cost before it is needed, as in :meth:`cut`. (The
        stream's tokens after this sentence may come faster, decoded already: the horizon errs on the safe
        side.) Before the sentence's first window, not where the slower steps would make the plan cover (its first
        piece may then come late, by design). Where the stream alone is slower than real time (no plan avoids gaps;
        sentences decoded together end sooner, so the listener waits less in all), and unpaced (no speeds yet, or
        ``stream_pace`` off): always."""
        if not self.paced:
            return True
        if deadline is None:
            return False
        if self._n_star(self.rates.token_s * self.slow) == math.inf:
            return True  # slower than real time alone: no plan avoids gaps, and rows decoded together shorten them
        top = self.cfg.stream_chunk_tokens
        token_s = max(self.token_s, self._step_s(rows))  # (the plan's speeds at the last token)
        if self.done == 0 and self._n_star(token_s) > top:
            return False  # the plan would cover from the sentence's first piece (which the listener may wait for)
        rest = max(0, math.ceil((self.expected_tokens or 0) * TAPER_HEADROOM) - self.done - new_tokens) or top
        left = max(rest, joining_tokens or top)  # this stream's tokens while the sentence joining decodes
        work, played_until, have = stall_s, deadline - now, new_tokens
        while have + left > 0:
            n = min(top, have + left)
            cost = self.cost(n)
            fresh = max(0, n - have)
            work += fresh * token_s + cost
            if work + SAFETY_S + SAFETY_FRACTION * cost > played_until:
                return False
            ends = rest > 0 and rest - fresh <= 0  # this sentence's last window: its lookahead and pause
            have, left, rest = max(0, have - n), left - fresh, rest - fresh
            played_until += self._audio(n, False, ends)
        return True

    def _feeding(self, n: int) -> int:
        """The tokens of a first piece that holds what a window of ``n`` tokens takes (when it is cut), at most
        ``stream_chunk_tokens``."""
        cost = self.cost(n)
        need = self.token_s * n + cost + SAFETY_S + SAFETY_FRACTION * cost  # queued when it is cut
        first = self.cfg.stream_lookahead_tokens + math.ceil(need / self.audio_per_token)
        return min(self.cfg.stream_chunk_tokens, first)

    def _covering_first(self, total: int, have: int = 0, queued: float = 0.0, tail=..., exact: bool = True) -> int:
        """The fewest tokens (``stream_first_tokens`` and ``have`` at least) a first piece needs so that the rest of
        the request arrives before the listener runs dry (:meth:`_keeps_up_after`): the rest of this ``total``-token
        sentence and the later sentences; ``total`` (the whole sentence in one piece, the most that can be held
        back) if none. ``have``: tokens decoded already, ``queued``: seconds of audio the listener has in hand now.
        (A larger first piece mostly helps: bisection, then, where ``exact``, the smaller ones below it.)"""
        lo = max(self.cfg.stream_first_tokens, have)
        hi = max(lo, total)
        low = lo
        while lo < hi:
            mid = (lo + hi) // 2
            if self._keeps_up_after(mid, total, have, queued, self.after, tail):
                hi = mid
            else:
                lo = mid + 1
        if not exact:
            return hi
        # shrinking windows make a rest of one token more or less fit them better or worse: the first that keeps
        # up below the bisection's
        return next((n for n in range(low, hi) if self._keeps_up_after(n, total, have, queued, self.after, tail)),
                    hi)

    def _keeps_up_after(self, first: int, total: int, have: int | None = None, queued: float = 0.0,
                        after: list[tuple[int, float]] = (), tail=...) -> bool:
        """Whether, after a first piece of ``first`` tokens (``have`` of them decoded now, all by default) of a
        ``total``-token rest of the sentence, every later piece arrives before the listener needs it: the rest of
        this sentence and then each sentence of ``after`` (:attr:`after`'s form: its prefill and BERT first) in
        the windows of :meth:`windows` (this sentence's ``tail``, default :attr:`tail`), each sentence's end with its
        ``fragment_interval`` pause. The timing model of :meth:`cut`: the GPT and SoVITS one after another, each
        window ready :data:`SAFETY_S` + :data:`SAFETY_FRACTION` of its cost before it is needed; the listener hears
        ``queued`` seconds first and may wait for the first piece."""
        tail = self.tail if tail is ... else tail
        work = (first - (first if have is None else have)) * self.token_s + self.cost(first)  # seconds from now
        played_until = max(work, queued) + self._audio(first, True, first >= total)
        for start_s, tokens, fresh in [(0.0, max(0, total - first), False)] + [(w, t, True) for t, w in after]:
            work += start_s
            done = 0
            shrinking = not fresh and tail is not None
            for n in self.windows(tokens, None if fresh else tail):  # (later sentences do not shrink theirs)
                cost = self.cost(n)
                work += n * self.token_s + cost
                if work + SAFETY_S + SAFETY_FRACTION * cost + (TAPER_SAFETY_S if shrinking else 0.0) > played_until:
                    return False
                played_until += self._audio(n, fresh and done == 0, done + n >= tokens)
                done += n
        return True

    def _end(self) -> int:
        """The sentence's length the plan works to: as expected, or :data:`TAPER_HEADROOM` more with a tail."""
        expected = self.expected_tokens or 0
        return expected if self.tail is None else math.ceil(expected * TAPER_HEADROOM)

    def windows(self, tokens: int, tail=...) -> list[int]:
        """The window sizes, in order, for a sentence's next ``tokens`` tokens while the pacer covers. ``tail``
        (default :attr:`tail`) None: windows of ``stream_chunk_tokens``, the leftover last; ``(last, step)``: the
        last window has ``last`` tokens and each one before it ``step`` more, up to ``stream_chunk_tokens`` (a
        small leftover joins the first). Smaller windows at the end let the first piece be smaller: the listener
        waits for less of the sentence's audio at its end, for the overhead of the further windows."""
        top = self.cfg.stream_chunk_tokens
        tail = self.tail if tail is ... else tail
        if tail is None:
            return [top] * (tokens // top) + ([tokens % top] if tokens % top else [])
        (n, step), sizes, left = tail, [], tokens
        while left > 0:
            planned = min(n, top)
            sizes.append(min(planned, left))
            left -= sizes[-1]
            n += step
        if len(sizes) > 1 and sizes[-1] < planned and sizes[-1] + sizes[-2] <= top:  # a leftover (the front
            sizes[-2:] = [sizes[-2] + sizes[-1]]  # window cut short) joins the window after it
        return sizes[::-1]

    def _audio(self, tokens: int, first: bool, last: bool) -> float:
        """Seconds of audio a window of ``tokens`` new tokens sends: the first of a sentence holds back the lookahead,
        the last sends it, with the sentence's pause."""
        lookahead = self.cfg.stream_lookahead_tokens
        sent = tokens - (lookahead if first else 0) + (lookahead if last else 0)
        return sent * self.audio_per_token + (self.cfg.fragment_interval if last else 0.0)

    def live(self, seconds: float, tokens: int) -> None:
        """This sentence's ``tokens`` GPT tokens since the last cut took ``seconds``, each a step alone with the lane
        idle: from :data:`LIVE_MIN_TOKENS` on, the plan takes every speed (GPT, text encoder and flow, vocoder) that
        much slower than the recent medians (at most :data:`LIVE_MAX`; never faster, see there): the machine as it is
        now (a co-tenant that started since the medians were measured), not as it was."""
        if self.options.live and self.paced and tokens >= LIVE_MIN_TOKENS:
            ratio = self.rates.live_ratio(seconds, tokens)
            if ratio is not None:
                self.live_ratio = ratio

    def estimate(self, new_tokens: int) -> float:
        """A window's seconds (its GPT tokens and SoVITS) by the plan's speeds with the live speed but before the
        windows' measured slowdown: what :meth:`StreamRates.note_window` compares the window's measured seconds
        with."""
        return (new_tokens * self.token_s + self.cost(new_tokens)) / self.error_slow

    def cost(self, new_tokens: int) -> float:
        """Estimated seconds of a window emitting ``new_tokens`` tokens (SoVITS up to and with the vocoder)."""
        return self.latent_s + self.frame_s * (new_tokens * self.frames_per_token + self.extra_frames)

    def cut(self, new_tokens: int, now: float, deadline: float | None) -> bool:
        """Whether to cut a window now, ``new_tokens`` tokens after the previous cut (of this sentence).

        ``now``: the clock; ``deadline``: when the audio already sent will have been played (None before the
        stream's first audio)."""
        if self._cut(new_tokens, now, deadline):
            self.done += new_tokens
            return True
        return False

    def _cut(self, new_tokens: int, now: float, deadline: float | None) -> bool:
        if not self.paced:
            if self.next_step is None:
                self.next_step = next(self.steps)
            if new_tokens < self.next_step:
                return False
            self.next_step = None
            return True
        self._plan()
        top = self.cfg.stream_chunk_tokens
        queued = 0.0 if deadline is None else max(0.0, deadline - now)
        if self._wait_is_up(new_tokens, now, deadline):
            return True
        if (self.options.end_waits and self.expected_tokens and self.done + new_tokens == self.expected_tokens
                and (deadline is None or queued > self.token_s + self.cost(new_tokens) + SAFETY_S)):
            # the sentence's expected last token: one step more shows whether it ends here; then this window is
            # its last (the lookahead and the pause with it, as the plans have it), not one more of no new tokens
            return False
        if self.covering and (self.done == 0 or queued == 0.0):  # the sentence's first piece, or the listener ran
            # dry: a piece after which the rest keeps up
            total = self._end() - self.done  # (the most it waits for: the expected rest, as without a tail)
            if new_tokens >= max(self.cfg.stream_first_tokens, self.expected_tokens - self.done):
                return True
            if new_tokens < self.cfg.stream_first_tokens or not self._keeps_up_after(
                    new_tokens, total, new_tokens, queued, self.after):
                return False
            if queued == 0.0 or not self.options.later_full:  # the listener waits: the first piece after which the
                # rest keeps up
                return True
            # the listener has audio in hand (a later sentence's first piece): a larger piece leaves it more for
            # the rest (the plans before this one counted on windows of stream_chunk_tokens), unless waiting for one
            # more token would let it run dry first
            return new_tokens >= top or self._one_more_is_late(new_tokens, now, deadline)
        if deadline is None or (deadline <= now and self.sustainable):  # nothing is playing: a piece the listener
            return new_tokens >= self.first_tokens                       # can be kept fed after
        if new_tokens >= top:
            return True
        if self.covering and self.tail is not None:  # the next window of the plan (shrinking towards the end)
            return new_tokens >= self.windows(max(1, self._end() - self.done))[0]
        # slower than real time and the listener ran dry: the largest windows (n_min), which make the total wait
        # the shortest; small ones would spend the time on each window's overhead
        return new_tokens >= self.n_min and self._one_more_is_late(new_tokens, now, deadline)

    def _wait_is_up(self, new_tokens: int, now: float, deadline: float | None) -> bool:
        """:attr:`PacingOptions.max_wait_s`: whether the listener, waiting for its first audio (since
        :attr:`wait_since`) or once the audio sent has played (``deadline``, now or later), would wait longer than
        the bound if this window were cut one token later. The window must send audio (a sentence's first: more
        tokens than the lookahead)."""
        bound = self.options.max_wait_s
        if bound <= 0:
            return False
        if self.wait_since is None:
            self.wait_since = now
        since = self.wait_since if deadline is None else deadline  # (the listener runs, or ran, dry at deadline)
        if new_tokens <= (self.cfg.stream_lookahead_tokens if self.done == 0 else 0):
            return False
        cost = self.cost(new_tokens + 1)
        return now + self.token_s + cost + SAFETY_FRACTION * cost >= since + bound

    def _one_more_is_late(self, new_tokens: int, now: float, deadline: float) -> bool:
        """Whether the window, if one more token is awaited, would be ready later than the safety margin before
        ``deadline`` (when the audio already sent will have been played)."""
        estimate = self.cost(new_tokens + 1)
        return now + self.token_s + estimate >= deadline - SAFETY_S - SAFETY_FRACTION * estimate
