"""engine/pacing.py: the window plan of a stream from measured speeds, and the engine measuring them.

The plan is checked against a small simulation of a stream and a player (the same timing model as
tests/tools/stream_keeps_up.py: a piece plays from its arrival or when the previous one ends): with the
machine's speeds as the pacer assumes them, a paced stream never lets the player run dry, where the fixed
steps do; on a fast machine the paced first audio comes after exactly ``stream_first_tokens``."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_engine import case, model_dir, voice  # noqa: F401  (shared fixtures)
from test_engine import engine as engine  # noqa: F401,F811

from dora_primespeech_mlx.engine import pacing
from dora_primespeech_mlx.engine.config import SynthesisConfig
from dora_primespeech_mlx.engine.pacing import (
    SAFETY_FRACTION,
    SAFETY_S,
    Pacer,
    PacingOptions,
    StreamRates,
    window_steps,
)
from dora_primespeech_mlx.errors import ConfigError

HOP_S = 0.02  # seconds of audio per latent frame (640 samples at 32 kHz)
MARGIN, XF = 13, 1


def simulate(cfg: SynthesisConfig, rates: StreamRates, n_tokens: int, expected: int | None = None,
             slow: list[float] = (1.0,), queued: float = 0.0, options: PacingOptions | None = None):
    """A stream of one sentence on a machine with exactly ``rates``' speeds (window i and its tokens ``slow[i %
    len(slow)]`` times slower: a machine slower than measured, or noisy): returns (first audio time, worst margin,
    window sizes). Prefill time is left out (it shifts every arrival alike). ``expected``: the sentence's length
    as the engine expects it; ``queued``: seconds of audio (an earlier sentence's) the listener has at the start
    (the first piece may come after it: the worst margin is the later pieces')."""
    first, worst, plans = simulate_request(cfg, rates, [n_tokens], 0.0, expected is not None, slow, queued,
                                           pause=False, lengths_expected=[expected], options=options)
    return first, worst, plans[0]


def simulate_request(cfg: SynthesisConfig, rates: StreamRates, lengths: list[int], start_s: float,
                     expected: bool = True, slow: list[float] = (1.0,), queued: float = 0.0, pause: bool = True,
                     lengths_expected: list[int | None] | None = None, eos_step: bool = False,
                     options: PacingOptions | None = None):
    """A stream of several sentences, one after another as the pacer covers: each sentence ``start_s`` of work
    (prefill, BERT) before its first token and (``pause``) ``cfg.fragment_interval`` of silence after its audio.
    Returns (first audio time, worst margin, per sentence its window sizes). ``lengths_expected``: the lengths the
    pacer expects (default: the true ones, where ``expected``). ``eos_step``: as the engine, a sentence's end shows
    one GPT step after its last token (its end-of-sequence token), where its last window is cut (of no new tokens
    if a window was cut at its last token). ``options``: the plan's choices (default the engine's)."""
    first, margins, plans, _ = simulate_timeline(cfg, rates, lengths, start_s, expected, slow, queued, pause,
                                                 lengths_expected, eos_step, options)
    return first, min(margins) if margins else None, plans


def simulate_timeline(cfg: SynthesisConfig, rates: StreamRates, lengths: list[int], start_s: float,
                      expected: bool = True, slow: list[float] = (1.0,), queued: float = 0.0, pause: bool = True,
                      lengths_expected: list[int | None] | None = None, eos_step: bool = False,
                      options: PacingOptions | None = None, live: bool = False):
    """:func:`simulate_request`'s stream: (first audio time, every later piece's margin, per sentence its window
    sizes, when the last audio has played). ``live``: as the engine, the pacer hears each token's seconds since the
    last cut (:meth:`Pacer.live`)."""
    options = options or PacingOptions()
    lengths_expected = lengths_expected or (lengths if expected else [None] * len(lengths))
    now, until, first, margins, plans = 0.0, queued or None, None, [], []
    L = cfg.stream_lookahead_tokens
    for k, n_tokens in enumerate(lengths):
        now += start_s
        ahead = options.plans_ahead(k, waiting=until is None or until <= now)
        after = [(t, start_s) for t in lengths_expected[k + 1:]] if expected and ahead else []
        pacer = Pacer(cfg, rates, 1.0, MARGIN, XF, HOP_S, lengths_expected[k], after, taper=k == 0,
                      options=options)  # (as the engine)
        tokens, cut_at, done_tokens, sizes = 0, 0, 0, []
        while True:
            now += rates.token_s * slow[len(sizes) % len(slow)]
            if live and tokens < n_tokens:
                pacer.live((tokens + 1 - cut_at) * rates.token_s * slow[len(sizes) % len(slow)], tokens + 1 - cut_at)
            if tokens == n_tokens:  # the end-of-sequence step
                final = True
            else:
                tokens += 1
                final = tokens == n_tokens and not eos_step
            if not final and not pacer.cut(tokens - cut_at, now, until):
                continue
            sizes.append(tokens - cut_at)
            cut_at = tokens
            stop = tokens if final else tokens - L
            emitted = stop - done_tokens
            frames = 2 * emitted + XF + MARGIN + (0 if final else min(MARGIN, 2 * L))
            now += (rates.latent_s + rates.frame_s * frames) * slow[(len(sizes) - 1) % len(slow)]
            done_tokens = stop
            duration = 2 * emitted * HOP_S + (cfg.fragment_interval if final and pause else 0.0)
            if first is None:
                first, until = now, max(now, until or now) + duration
            else:
                margins.append(until - now)
                until = max(until, now) + duration
            if final:
                break
        plans.append(sizes)
    return first, margins, plans, until


def rates_of(token_s: float, frame_s: float, latent_s: float) -> StreamRates:
    """Rates as if measured once each."""
    r = StreamRates()
    r.note_tokens(token_s, 1)
    r.note_vocoder(frame_s, 1)
    r.note_latent(latent_s, window=True)
    return r


SLOW = rates_of(token_s=0.010, frame_s=0.0079, latent_s=0.06)  # this repo's 2-core VM at 1 thread (README)
FAST = rates_of(token_s=0.002, frame_s=0.0005, latent_s=0.01)


def test_speeds_are_kept_per_thread_count():
    """A request at one thread (a co-tenant took the other core) plans with one thread's speeds, not the idle
    two-thread warm-up's: until it has its own, the two-thread speeds stand in twice as slow; never faster at a
    count with more threads. Each count keeps its own measurements and its own slowdown."""
    r = pacing.StreamRates()
    r.use(2)
    r.note_tokens(0.01, 1)
    r.note_vocoder(0.004, 1, window=True)
    r.note_latent(0.05, window=True)
    r.note_start("prefill", 0.3)
    r.note_window(1.5, 1.0)
    two = (r.token_s, r.frame_s, r.latent_s, r.start_s("prefill"))
    assert two == pytest.approx((0.01, 0.004, 0.05, 0.3)) and r.slowdown == pytest.approx(1.5)
    r.use(1)
    assert (r.token_s, r.frame_s, r.latent_s, r.start_s("prefill")) == pytest.approx(tuple(2 * v for v in two))
    assert r.slowdown == 1.0 and r.threads == 1 and r.as_dict()["threads"] == 1
    r.note_tokens(0.013, 1)
    r.note_vocoder(0.007, 1, window=True)
    assert (r.token_s, r.frame_s, r.latent_s) == pytest.approx((0.013, 0.007, 0.1))  # its own, the rest stand-ins
    r.use(4)
    assert (r.token_s, r.frame_s) == pytest.approx((0.01, 0.004))  # the nearest count's (2), not faster
    r.use(2)
    assert (r.token_s, r.frame_s, r.latent_s, r.start_s("prefill")) == pytest.approx(two)


def test_fixed_steps_starve_on_a_slow_machine_and_pacing_does_not():
    fixed = SynthesisConfig(stream_pace=False)
    paced = SynthesisConfig()
    _, fixed_margin, _ = simulate(fixed, SLOW, 110)
    first, margin, sizes = simulate(paced, SLOW, 110)
    assert fixed_margin < -0.1  # the gaps the fixed steps leave (measured on the VM: -0.2 s)
    assert margin >= 0, (margin, sizes)
    assert sizes[0] > paced.stream_first_tokens  # one wait at the start instead
    assert max(sizes) <= paced.stream_chunk_tokens


def test_fast_machine_keeps_the_first_audio_early():
    cfg = SynthesisConfig()
    first, margin, sizes = simulate(cfg, FAST, 110)
    assert sizes[0] == cfg.stream_first_tokens
    assert margin >= 0
    # with audio queued the windows grow (fewer windows, less overhead) up to stream_chunk_tokens
    assert max(sizes) == cfg.stream_chunk_tokens


@pytest.mark.parametrize("rates", [SLOW, FAST, rates_of(0.006, 0.004, 0.03)])
def test_paced_plan_keeps_up_wherever_the_machine_is_faster_than_real_time(rates):
    for first_tokens in (4, 12, 20):
        cfg = SynthesisConfig(stream_first_tokens=first_tokens)
        _, margin, sizes = simulate(cfg, rates, 200)
        assert margin >= 0, (first_tokens, margin, sizes)


def test_slower_than_real_time_gives_early_audio_then_large_windows():
    cfg = SynthesisConfig()
    pacer = Pacer(cfg, rates_of(0.02, 0.012, 0.1), 1.0, MARGIN, XF, HOP_S)
    assert not pacer.sustainable
    assert pacer.first_tokens == cfg.stream_first_tokens and pacer.n_min == cfg.stream_chunk_tokens
    assert pacer.cut(cfg.stream_first_tokens, 10.0, None)  # the first audio as early as asked
    # once the listener ran dry the windows stay large: small ones would lengthen the total wait
    assert not pacer.cut(cfg.stream_first_tokens, 10.0, 9.0)
    assert not pacer.cut(cfg.stream_chunk_tokens - 1, 10.0, 9.0) and pacer.cut(cfg.stream_chunk_tokens, 10.0, 9.0)


def test_unknown_speeds_or_pace_off_follow_the_fixed_steps():
    for cfg, rates in ((SynthesisConfig(), StreamRates()), (SynthesisConfig(stream_pace=False), SLOW),
                       (SynthesisConfig(), None)):
        pacer = Pacer(cfg, rates, 1.0, MARGIN, XF, HOP_S)
        assert not pacer.paced
        steps, sizes, n = window_steps(cfg), [], 0
        while len(sizes) < 6:
            n += 1
            if pacer.cut(n, 0.0, None):
                sizes.append(n)
                n = 0
        assert sizes == [next(steps) for _ in range(6)]


def test_cut_is_just_in_time():
    cfg = SynthesisConfig()
    pacer = Pacer(cfg, SLOW, 1.0, MARGIN, XF, HOP_S)
    n = pacer.n_min + 2
    wait = SLOW.token_s + pacer.cost(n + 1)
    assert not pacer.cut(n, 10.0, 10.0 + wait + 1.0)  # plenty queued: wait for more tokens
    assert pacer.cut(n, 10.0, 10.0 + wait)  # one more token would be late
    assert not pacer.cut(pacer.n_min - 1, 10.0, 10.0 + wait)  # never below the sustainable size ...
    assert pacer.cut(cfg.stream_chunk_tokens, 10.0, 1e9)  # ... nor above stream_chunk_tokens
    assert pacer.cut(pacer.first_tokens, 10.0, 9.0) and not pacer.cut(pacer.first_tokens - 1, 10.0, 9.0)


def test_speed_factor_changes_the_audio_per_token():
    slow_speech = Pacer(SynthesisConfig(), SLOW, 0.8, MARGIN, XF, HOP_S)  # longer audio per token
    fast_speech = Pacer(SynthesisConfig(), SLOW, 1.25, MARGIN, XF, HOP_S)
    assert slow_speech.audio_per_token == pytest.approx(0.04 / 0.8)
    assert slow_speech.first_tokens < fast_speech.first_tokens


def test_rates_are_recent_medians_and_prefer_window_measurements():
    r = StreamRates()
    assert not r.known()
    r.note_tokens(1.0, 100)
    r.note_vocoder(0.8, 100)
    r.note_latent(0.5, window=False)  # a whole sentence's: a stand-in until a window is measured
    assert r.known() and r.latent_s == 0.5
    r.note_latent(0.1, window=True)
    assert r.latent_s == 0.1
    r.note_latent(0.9, window=False)  # whole sentences no longer count
    assert r.latent_s == 0.1
    assert r.frame_s == pytest.approx(0.008)  # (vocoder seconds: still the whole sentence's)
    r.note_vocoder(0.5, 50, window=True)  # a window's vocoder: per frame dearer than a whole (cut) sentence's
    assert r.frame_s == pytest.approx(0.01)
    r.note_vocoder(0.2, 100)
    assert r.frame_s == pytest.approx(0.01)
    for seconds in (2.0, 1.2, 50.0):  # one stray slow measurement does not move the median far
        r.note_tokens(seconds, 100)
    assert r.token_s == pytest.approx(0.016)
    r.note_tokens(1.0, 0)  # nothing measured: ignored
    assert r.token_s == pytest.approx(0.016)
    for _ in range(20):
        r.note_tokens(0.5, 100)
    assert r.token_s == pytest.approx(0.005)  # only the recent ones count


def test_stream_pace_must_be_a_bool():
    with pytest.raises(ConfigError, match="stream_pace"):
        SynthesisConfig(stream_pace="yes")


def test_engine_measures_its_speeds_and_the_paced_stream_matches_the_whole(engine):
    kw = {"text_split_method": "cut0", "top_k": 1, "seed": 7, "speed_factor": 1.0}
    text = "Hello world, this is a small test."
    whole = engine.synthesize(text, **kw)
    r = engine.rates
    assert r.known() and r.token_s > 0 and r.frame_s > 0
    voice_name = engine.voice.name
    assert r.expected_tokens(voice_name, 50) > 0 and r.expected_tokens(voice_name + "-other", 50) is None
    lengths = len(r._lengths[voice_name])
    chunks = list(engine.synthesize_stream(text, stream_chunk_tokens=10, stream_context_tokens=8, **kw))
    assert r.latent_from_windows
    assert len(r._lengths[voice_name]) == lengths + 1  # the stream's sentence, too
    assert r._now.errors and 1.0 <= r.slowdown <= 2.0  # its windows against the plan's estimates
    assert r.threads == engine.threads.compute()  # the speeds of the thread count the requests ran at
    assert r.start_s("prefill") > 0  # its sentence's prefill, for the plans of later sentences
    streamed = np.concatenate([c.audio for c in chunks])
    assert len(streamed) == len(whole.audio)
    gap = int(0.3 * 32000)
    rel = float(np.linalg.norm(streamed[:-gap] - whole.audio[:-gap]) / np.linalg.norm(whole.audio[:-gap]))
    assert rel < 0.3
    assert engine.stats()["stream_rates"] == r.as_dict()
    st = engine.stats()["mean_timings"]
    assert st["sovits_stream"] > 0  # a stream's windows are timed apart from whole decodes' "sovits"
    assert math.isfinite(st["sovits"])


# A machine only a little faster than real time (the 2-core VM at 1 thread, engine.stats()["stream_rates"]): the
# break-even window n* is above stream_chunk_tokens, so windows of at most 40 tokens lose on the listener
NEAR = rates_of(token_s=0.0155, frame_s=0.0105, latent_s=0.08)


def test_near_real_time_the_first_piece_covers_the_expected_rest_of_the_sentence():
    cfg = SynthesisConfig()
    pacer = Pacer(cfg, NEAR, 1.0, MARGIN, XF, HOP_S)
    assert pacer.sustainable and pacer.n_min == cfg.stream_chunk_tokens
    _, unknown_margin, sizes = simulate(cfg, NEAR, 106)
    assert unknown_margin < -0.05, sizes  # length unknown: the pieces of 40 tokens fall behind (as measured)
    for n in (60, 106, 180, 400):
        first, margin, sizes = simulate(cfg, NEAR, n, expected=n)
        assert margin is None or margin >= 0, (n, margin, sizes)
        assert sizes[0] > cfg.stream_chunk_tokens or n < 100  # (a short sentence: 40 + the rest may do)
        assert max(sizes[1:], default=0) <= cfg.stream_chunk_tokens
        # the fewest tokens that do it: one token less and the simulated listener runs dry
        if len(sizes) > 1:
            smaller = Pacer(cfg, NEAR, 1.0, MARGIN, XF, HOP_S, n)
            assert not smaller._keeps_up_after(sizes[0] - 1, smaller._end())  # (the plan's end: see the tail)
    # a sentence shorter than expected only has more in hand
    _, margin, _ = simulate(cfg, NEAR, 80, expected=106)
    assert margin is None or margin >= 0
    # the next sentence of a stream, with audio still queued: no gap inside it, and the more is queued the earlier
    # its first piece (a wait, if any, falls between the sentences)
    firsts = []
    for queued in (0.3, 1.0, 3.0):
        first, margin, sizes = simulate(cfg, NEAR, 106, expected=106, queued=queued)
        assert margin is None or margin >= 0, (queued, margin, sizes)
        firsts.append(sizes[0])
    assert firsts[0] >= firsts[1] >= firsts[2] and firsts[0] > firsts[2], firsts
    # slower than real time: early audio then gaps where the length is unknown, one wait at the start where known
    slower = rates_of(0.02, 0.012, 0.1)
    first_unknown, margin, _ = simulate(cfg, slower, 106)
    assert margin < -0.3
    first, margin, sizes = simulate(cfg, slower, 106, expected=106)
    assert margin is None or margin >= 0, sizes
    assert first > first_unknown and max(sizes[1:], default=0) <= cfg.stream_chunk_tokens
    # a fast machine is unaffected by the expected length
    assert simulate(cfg, FAST, 106, expected=106)[2] == simulate(cfg, FAST, 106)[2]


def test_expected_length_is_the_voice_s_recent_tokens_per_phone():
    r = StreamRates()
    assert r.expected_tokens("a", 40) is None
    r.note_length("a", 100, 40)
    r.note_length("a", 120, 40)
    r.note_length("a", 0, 40)  # nothing decoded: ignored
    r.note_length("b", 300, 40)  # another voice speaks slower
    assert r.expected_tokens("a", 40) == 110 and r.expected_tokens("a", 20) == 55
    assert r.expected_tokens("b", 40) == 300
    assert r.expected_tokens("a", 0) is None


def test_windows_slower_than_estimated_slow_the_plan_s_speeds_down():
    r = rates_of(0.010, 0.0079, 0.06)
    assert r.slowdown == 1.0  # nothing measured: the speeds as measured
    for ratio in (0.8, 1.0, 1.05):
        r.note_window(ratio, 1.0)
    assert r.slowdown == pytest.approx(1.0)  # windows faster than estimated never speed the plan up
    for _ in range(4):
        r.note_window(1.4, 1.0)
    assert r.slowdown == pytest.approx(1.4)  # most windows 40 % slower than estimated: a bias
    r.note_window(0.0, 1.0)  # nothing measured: ignored
    assert r.slowdown == pytest.approx(1.4)
    for _ in range(9):
        r.note_window(1.0, 1.0)
    assert r.slowdown == pytest.approx(1.0)  # only the recent windows count
    for ratio in [1.0] * 5 + [1.3, 1.2, 3.0, 5.0]:  # noise and strays do not set it (the margins are for them) ...
        r.note_window(ratio, 1.0)
    assert r.slowdown == pytest.approx(1.0)
    for _ in range(9):  # ... and it never exceeds SLOWDOWN_MAX
        r.note_window(5.0, 1.0)
    assert r.slowdown == pytest.approx(2.0)
    assert r.as_dict()["slowdown"] == pytest.approx(2.0)
    pacer = Pacer(SynthesisConfig(), r, 1.0, MARGIN, XF, HOP_S)
    assert pacer.token_s == pytest.approx(0.02) and pacer.latent_s == pytest.approx(0.12)
    assert pacer.estimate(10) == pytest.approx(10 * 0.01 + 0.06 + 0.0079 * (20 + MARGIN + XF + 8))


@pytest.mark.parametrize("base", [SLOW, rates_of(0.006, 0.004, 0.03)])
@pytest.mark.parametrize("pattern", [[1.3], [1.0, 1.3], [1.3, 1.0, 1.0]])
def test_a_machine_slower_than_measured_keeps_up_once_its_windows_show_it(base, pattern):
    cfg = SynthesisConfig()
    rates = rates_of(base.token_s, base.frame_s, base.latent_s)
    _, before, sizes = simulate(cfg, rates, 200, expected=200, slow=pattern)
    if base is SLOW:  # windows up to 30 % slower than the speeds say: the fixed margins fall short
        assert before < 0, sizes
    for _ in range(3):
        rates.note_window(1.3, 1.0)
    first_after, after, sizes = simulate(cfg, rates, 200, expected=200, slow=pattern)
    assert after >= 0, sizes
    assert first_after < 2.5 and len(sizes) > 3  # still a stream, not the whole sentence at once


def test_near_real_time_the_first_piece_covers_the_request_s_later_sentences():
    cfg = SynthesisConfig()
    lengths, start_s = [90, 70, 110], 0.4
    _, unknown, plans = simulate_request(cfg, NEAR, lengths, start_s, expected=False)
    assert unknown < -0.1, plans  # lengths unknown: gaps
    first_one, _, plans_one = simulate(cfg, NEAR, lengths[0], expected=lengths[0])
    first, margin, plans = simulate_request(cfg, NEAR, lengths, start_s)
    assert margin >= 0, plans  # no gap inside a sentence nor between two
    assert plans[0][0] > plans_one[0] and first > first_one  # the first piece holds what the later ones lose
    assert all(max(p[1:], default=0) <= cfg.stream_chunk_tokens for p in plans)
    r = StreamRates()
    assert r.start_s("prefill") == 0.0 and r.start_s("bert") == 0.0
    r.note_start("prefill", 0.4)
    r.note_start("bert", 0.2, 40)
    r.note_start("bert", 0.0, 40)  # nothing measured (no Chinese): ignored
    assert r.start_s("prefill") == pytest.approx(0.4) and r.start_s("bert") == pytest.approx(0.005)


def test_a_stream_measures_each_sentence_s_start_once(engine, monkeypatch):
    """Each sentence's start (BERT, prefill) is noted once, where its turn computes it: a sentence that joined the
    running decode earlier (continuous batching, when the listener had enough audio in hand) has none at its
    turn, so whether the second sentence is noted depends on the machine's speed and the GPT's lengths."""
    from dora_primespeech_mlx.engine import batching

    kw = {"text_split_method": "cut5", "top_k": 1, "seed": 7, "speed_factor": 1.0}
    notes = []
    real = engine.rates.note_start
    monkeypatch.setattr(engine.rates, "note_start", lambda kind, seconds, phones=1: (
        notes.append((kind, phones)), real(kind, seconds, phones)))
    text = "Hello world. This is a small test."
    chunks = list(engine.synthesize_stream(text, **kw))
    assert {c.sentence_index for c in chunks} == {0, 1}
    kinds = [k for k, _ in notes]
    # the request's BERT (with its first sentence); the second sentence's BERT and prefill at its turn, unless
    # it joined earlier; the first sentence's prefill always
    assert kinds.count("bert") == kinds.count("prefill") and 1 <= kinds.count("prefill") <= 2, notes
    notes.clear()
    monkeypatch.setattr(batching, "ADMIT_QUEUED_S", float("inf"))  # no sentence joins early: both turns measure
    assert {c.sentence_index for c in engine.synthesize_stream(text, **kw)} == {0, 1}
    kinds = [k for k, _ in notes]
    assert kinds.count("bert") == 2 and kinds.count("prefill") == 2, notes


def test_first_audio_bound_tool_schedules_keep_up_and_start_no_later_than_the_pacer():
    """tests/tools/first_audio_bound.py (docs/performance.md's first-audio arithmetic): at speeds near real time
    its best schedule starts no later than the pacer's covering plan, fills the sentence with windows of at most
    ``stream_chunk_tokens``, and the pacer's own plan is among the schedules it accepts."""
    import argparse
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tools" / "first_audio_bound.py"
    spec = importlib.util.spec_from_file_location("first_audio_bound", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    args = argparse.Namespace(token_s=NEAR.token_s, frame_s=NEAR.frame_s, latent_s=NEAR.latent_s, margin_frames=8,
                              crossfade_frames=1)
    for total in (60, 100, 250):
        p = tool.pacer_for(args, total)
        assert p.covering
        best = tool.best_schedule(p, total, smallest=1)
        assert sum(best) == total and max(best[1:], default=0) <= p.cfg.stream_chunk_tokens
        assert best[0] <= p._covering_first(total)  # the pacer's plan (its tail)
        first = p._covering_first(total, tail=None)
        top, slack = p.cfg.stream_chunk_tokens, p._audio(first, True, first == total)  # the pacer's plan, windows
        for done in range(first, total, top):  # of stream_chunk_tokens, by the tool's rule: each ready in time
            n = min(top, total - done)
            cost = p.cost(n)
            assert slack - n * p.token_s - cost >= SAFETY_S + SAFETY_FRACTION * cost - 1e-9
            slack += p._audio(n, False, done + n == total) - n * p.token_s - cost


@pytest.mark.parametrize("n", [106, 180])
def test_near_real_time_shrinking_last_windows_let_the_first_piece_come_sooner(n):
    """While covering, the last windows shrink (Pacer.windows): the listener waits for less of the sentence's audio
    at its end, so the first piece can be smaller; no gap either way, and a sentence up to TAPER_HEADROOM longer
    than expected keeps up too (the plan works to that end)."""
    cfg = SynthesisConfig()
    first_fixed, margin, fixed = simulate(cfg, NEAR, n, expected=n, options=PacingOptions(taper=False))
    assert margin >= 0 and all(w == cfg.stream_chunk_tokens for w in fixed[1:-1]), fixed  # windows of 40
    first, margin, sizes = simulate(cfg, NEAR, n, expected=n)
    assert margin >= 0, sizes
    assert first < first_fixed - 0.1 and sizes[0] < fixed[0], (sizes, fixed)
    tail = sizes[1:]
    assert tail[-1] < cfg.stream_chunk_tokens and tail == sorted(tail, reverse=True), sizes  # shrinking
    longer = math.floor(n * pacing.TAPER_HEADROOM) - 1
    _, margin, sizes = simulate(cfg, NEAR, longer, expected=n)
    assert margin >= 0, sizes
    _, margin, sizes = simulate(cfg, NEAR, n * 3 // 4, expected=n)  # shorter: more in hand
    assert margin >= 0, sizes


def test_pacer_windows_shrink_by_their_step_and_a_short_leftover_joins_the_first():
    assert Pacer(SynthesisConfig(), NEAR, 1.0, MARGIN, XF, HOP_S, 100).tail is not None  # near real time: a tail
    assert Pacer(SynthesisConfig(), NEAR, 1.0, MARGIN, XF, HOP_S, 100, taper=False).tail is None  # a later sentence
    pacer = Pacer(SynthesisConfig(), NEAR, 1.0, MARGIN, XF, HOP_S, 100)
    assert pacer.windows(100, None) == [40, 40, 20]  # without a tail: windows of stream_chunk_tokens
    assert pacer.windows(42, (8, 6)) == [20, 14, 8]
    assert pacer.windows(45, (8, 6)) == [23, 14, 8]  # the leftover 3 joins the window after it
    assert pacer.windows(150, (8, 6)) == [12, 38, 32, 26, 20, 14, 8]  # (12 + 38 > 40: the leftover stays alone)
    assert pacer.windows(400, (16, 10)) == [2] + [40] * 8 + [36, 26, 16]  # (the first-piece search makes it 0)


@pytest.mark.parametrize("lengths,start_s", [([100, 100, 100], 0.4), ([120, 120, 120], 0.3), ([80, 100, 120], 0.4),
                                             ([100] * 5, 0.3)])
def test_near_real_time_later_sentences_keep_up_though_each_end_shows_a_step_late(lengths, start_s):
    """As in the engine, a sentence's end shows one step after its last token. A window cut at the expected last
    token would leave a window of no new tokens (its overhead only) for the end: such a window waits one step for
    the end instead (END_WAITS). A later sentence's first piece, with the earlier ones' audio in hand, grows to
    stream_chunk_tokens while the listener keeps audio (LATER_FULL), as the first sentence's plan counted on,
    instead of the smallest piece that keeps up. With both, these requests keep up; without, each has a gap."""
    cfg = SynthesisConfig()
    first, margin, plans = simulate_request(cfg, NEAR, lengths, start_s, eos_step=True)
    assert margin >= 0, plans
    assert all(0 not in sizes for sizes in plans), plans  # every sentence's last window has tokens
    neither = PacingOptions(later_full=False, end_waits=False)
    first_old, margin_old, plans_old = simulate_request(cfg, NEAR, lengths, start_s, eos_step=True, options=neither)
    assert margin_old < 0, plans_old
    assert first <= first_old + 2 * NEAR.token_s  # the first audio waits at most a step for the sentence's end


@pytest.mark.parametrize("expected", [40, 100])
@pytest.mark.parametrize("in_hand", [1.6, 2.0, 2.5, 30.0])
def test_a_later_sentence_s_first_piece_grows_while_the_listener_has_audio(expected, in_hand):
    """Covering (near real time), a later sentence whose listener has ``in_hand`` seconds queued: its first piece
    is cut at stream_chunk_tokens, or sooner where waiting a token longer would let the listener run dry, never
    smaller than the smallest piece after which the rest keeps up (what LATER_FULL off cuts), and in time wherever
    that one is."""
    cfg = SynthesisConfig()
    top = cfg.stream_chunk_tokens

    def first_cut(options: PacingOptions | None = None):
        pacer = Pacer(cfg, NEAR, 1.0, MARGIN, XF, HOP_S, expected, taper=False, options=options)
        assert pacer.covering
        for n in range(1, 2 * expected):
            now = n * NEAR.token_s
            if pacer.cut(n, now, in_hand):
                return n, now + pacer.cost(n), pacer
        raise AssertionError("no cut")

    n, ready, pacer = first_cut()
    smallest, ready_smallest, _ = first_cut(PacingOptions(later_full=False))
    assert n >= smallest
    if ready_smallest <= in_hand - SAFETY_S:
        assert ready <= in_hand - SAFETY_S
    if smallest < n < min(top, expected):  # cut before the largest window: one more token would have been late
        cost = pacer.cost(n + 1)
        assert (n + 1) * NEAR.token_s + cost >= in_hand - SAFETY_S - SAFETY_FRACTION * cost
    if in_hand > 10:  # (a piece ending at the expected end waits a step for it)
        assert n == (top if expected > top else expected + 1) and n > smallest
    if (expected, in_hand) == (40, 1.6):
        assert smallest < n < top


@pytest.mark.parametrize("scale,lengths,start_s", [(0.75, [100, 100, 100], 0.7), (0.85, [100] * 5, 0.7),
                                                   (0.7, [60, 120, 80], 0.5), (0.8, [100, 100, 100], 0.7)])
def test_windows_that_gain_little_cover_for_the_later_sentences_starts(scale, lengths, start_s):
    """A machine a little faster than real time (speeds of the 2-core Xeon VM's streams, scaled): the windows can
    gain on the listener, so the pacer cuts them just in time, but they gain too little to build, before a sentence
    ends, the audio the listener needs while the next sentence's prefill, BERT and first window run. Those requests
    cover (COVER_LATER): no gap, for a later first audio; without, a gap at a sentence's start."""
    rates = rates_of(0.0179 * scale, 0.0087 * scale, 0.118 * scale)
    cfg = SynthesisConfig()
    first, margin, plans = simulate_request(cfg, rates, lengths, start_s, eos_step=True)
    assert margin >= 0, plans
    first_old, margin_old, plans_old = simulate_request(cfg, rates, lengths, start_s, eos_step=True,
                                                        options=PacingOptions(cover_later=False))
    assert margin_old < 0, plans_old
    assert first > first_old  # the wait at the start the gap costs


@pytest.mark.parametrize("scale", [0.3, 0.45, 0.6])
def test_fast_machines_keep_the_just_in_time_first_piece(scale):
    """Where a token's work is well below its audio, the windows grow fast enough for the later sentences: the plan
    and the first audio are those without COVER_LATER."""
    rates = rates_of(0.0179 * scale, 0.0087 * scale, 0.118 * scale)
    cfg = SynthesisConfig()
    for lengths in ([100, 100, 100], [60, 120, 80]):
        new = simulate_request(cfg, rates, lengths, 0.5, eos_step=True)
        old = simulate_request(cfg, rates, lengths, 0.5, eos_step=True, options=PacingOptions(cover_later=False))
        assert new == old and new[1] >= 0, (new, old)


def test_step_seconds_by_rows_are_measured_or_grown_from_a_step_alone():
    r = StreamRates()
    assert r.step_s(1) is None and r.step_s(2) is None  # nothing measured
    r.note_tokens(0.010, 1)
    assert r.step_s(1) == pytest.approx(0.010)
    assert r.step_s(2) == pytest.approx(0.010 * pacing.STEP_GROWTH[2])
    assert r.step_s(8) == pytest.approx(0.010 * pacing.STEP_GROWTH[4] * 2)
    for seconds in (0.030, 0.018, 0.019):
        r.note_step(2, seconds)
    r.note_step(3, 0.0)  # nothing measured: ignored
    assert r.step_s(2) == pytest.approx(0.019)  # the median of the measured ones
    assert r.step_s(3) == pytest.approx(0.010 * pacing.STEP_GROWTH[3])


def xeon_2_threads() -> StreamRates:
    """The 2-core Xeon VM's stream speeds at 2 threads (tests/tools/paced_stream.py --trace): a step alone 12 ms,
    two rows 20 ms, three 24 ms, four 30 ms (slower than real time with the vocoder: 17 ms of a token's 40)."""
    r = rates_of(0.012, 0.0085, 0.085)
    for rows, seconds in ((2, 0.020), (3, 0.024), (4, 0.030)):
        r.note_step(rows, seconds)
    return r


def simulate_join(cfg: SynthesisConfig, rates: StreamRates, expected: int, in_hand: float, stall: float,
                  rows: int, n_tokens: int | None = None):
    """A sentence whose listener has ``in_hand`` seconds of audio queued (an earlier sentence's), decoded alone until,
    as in the engine, the pacer admits another sentence at a token (asked at every token while it does not cover),
    so that ``rows`` rows step together from there (its start: ``stall`` seconds). Returns (the token at which it
    joined or None, the worst margin of the windows cut after it, None without). ``n_tokens``: the sentence's true
    length (default: as expected). The timing model of :func:`simulate_request`."""
    n_tokens = n_tokens or expected
    pacer = Pacer(cfg, rates, 1.0, MARGIN, XF, HOP_S, expected, taper=False)
    step, now, until, joined = rates.token_s, 0.0, in_hand, None
    L = cfg.stream_lookahead_tokens
    tokens, cut_at, done_tokens, margins = 0, 0, 0, []
    while True:
        now += step
        tokens += 1
        final = tokens == n_tokens
        if joined is None and not final and not pacer.covering and pacer.admits(tokens - cut_at, now, until, stall,
                                                                                rows):
            now += stall
            pacer.rows, step, joined = rows, rates.step_s(rows), tokens
        if not final and not pacer.cut(tokens - cut_at, now, until):
            continue
        cut_at = tokens
        stop = tokens if final else tokens - L
        emitted, done_tokens = stop - done_tokens, stop
        frames = 2 * emitted + XF + MARGIN + (0 if final else min(MARGIN, 2 * L))
        now += rates.latent_s + rates.frame_s * frames
        if joined is not None:  # (a window cut after the join: the ones before it are the stream's alone)
            margins.append(until - now)
        until = max(until, now) + 2 * emitted * HOP_S + (cfg.fragment_interval if final else 0.0)
        if final:
            return joined, min(margins, default=None)


@pytest.mark.parametrize("rows", [2, 3, 4])
@pytest.mark.parametrize("expected", [60, 100, 150])
def test_a_sentence_joins_only_where_the_stream_keeps_up_with_the_slower_steps(rows, expected):
    """On a machine whose stream is a little faster than real time alone and slower with three or four rows (the
    2-core Xeon VM at 2 threads), another sentence joins the decode only where the listener's audio in hand covers
    its start and what the slower steps lose over the rest of the sentence: wherever it joins, the pacer's windows
    never let the listener run dry, also where the sentence turns out 10 % longer than expected; with plenty in
    hand it joins (after the sentence's first window: before it, the plan with the slower steps would cover), with
    little in hand later or not at all."""
    cfg, rates = SynthesisConfig(), xeon_2_threads()
    joined_at = {}
    for in_hand in np.arange(0.5, 12.01, 0.25):
        for n_tokens in (expected, round(expected * 1.1)):
            joined, margin = simulate_join(cfg, rates, expected, float(in_hand), 0.55, rows, n_tokens)
            assert joined is None or margin >= 0, (in_hand, n_tokens, joined, margin)
        joined_at[float(in_hand)] = joined
    assert joined_at[12.0] is not None
    assert joined_at[0.5] is None or joined_at[0.5] > joined_at[12.0]
    assert any(joined_at[h] != joined_at[12.0] for h in joined_at)  # what it joins at depends on what is in hand


def test_a_join_waits_for_audio_in_hand_that_covers_its_start_and_the_slower_steps():
    """Pacer.admits: the audio in hand must cover the joining sentence's start and what the slower steps lose while
    it decodes beside the stream."""
    cfg = SynthesisConfig()
    rates = xeon_2_threads()
    pacer = Pacer(cfg, rates, 1.0, MARGIN, XF, HOP_S, 100, taper=False)
    assert pacer.cut(1, 0.0, 3.0) is False
    pacer.done = 30  # (windows of 30 tokens were cut)
    assert not pacer.admits(1, 0.0, None, 0.5, 2)  # nothing sent yet: no join before the first audio
    assert pacer.admits(1, 0.0, 3.0, 0.5, 2)
    assert not pacer.admits(1, 0.0, 3.0, 2.9, 2)  # its start alone empties the listener's buffer
    assert not pacer.admits(1, 0.0, 1.6, 0.55, 3)  # what ADMIT_QUEUED_S alone let join: slower than real time after
    assert pacer.admits(1, 0.0, 6.0, 0.55, 4)  # four rows, slower than real time: what the buffer can spare
    assert not pacer.admits(1, 0.0, 3.0, 0.55, 4)
    pacer.done = 90  # near the sentence's end: the joining sentence's length is the horizon of its slower steps
    assert pacer.admits(1, 0.0, 2.5, 0.55, 3, 30) and not pacer.admits(1, 0.0, 2.5, 0.55, 3, 150)
    pacer.done = 0
    assert not pacer.admits(1, 0.0, 30.0, 0.55, 4)  # the sentence's first piece would cover
    slower = Pacer(cfg, rates_of(0.020, 0.012, 0.1), 1.0, MARGIN, XF, HOP_S, 100, taper=False)  # than real time
    assert slower.cut(1, 0.0, 1.6) is False
    slower.done = 30  # (no plan avoids gaps there: rows decoded together shorten them in all)
    assert slower.admits(1, 0.0, 1.6, 0.55, 4) and not slower.admits(1, 0.0, None, 0.55, 2)
    assert Pacer(cfg, StreamRates(), 1.0, MARGIN, XF, HOP_S, 100).admits(1, 0.0, None, 5.0, 4)  # no speeds yet
    assert Pacer(SynthesisConfig(stream_pace=False), rates, 1.0, MARGIN, XF, HOP_S, 100).admits(1, 0.0, 0.1, 5.0, 4)


@pytest.mark.parametrize("rates,lengths,start_s", [
    (NEAR, [100, 100, 100], 0.4),  # a little faster than real time: every plan covers
    (rates_of(0.0179 * 0.8, 0.0087 * 0.8, 0.118 * 0.8), [100, 100, 100], 0.7),  # windows gain, too little
    (rates_of(0.0179 * 0.7, 0.0087 * 0.7, 0.118 * 0.7), [60, 120, 80], 0.5),
])
def test_earliest_start_plans_the_first_sentence_as_if_alone(rates, lengths, start_s):
    """start="earliest" (PRIMESPEECH_STREAM_START): the request's first piece has no more tokens than the first
    sentence's alone, where gapless waits for more so that the later sentences start in time; the later sentences
    plan as before (with the audio in hand)."""
    cfg = SynthesisConfig()
    earliest = PacingOptions(start="earliest")
    _, _, alone = simulate_request(cfg, rates, lengths[:1], start_s, eos_step=True)
    first, margin, plans = simulate_request(cfg, rates, lengths, start_s, eos_step=True, options=earliest)
    first_gapless, margin_gapless, plans_gapless = simulate_request(cfg, rates, lengths, start_s, eos_step=True)
    assert plans[0][0] <= alone[0][0], (plans, alone)
    assert plans_gapless[0][0] > plans[0][0] and first_gapless > first, (plans_gapless, plans)
    assert margin_gapless >= 0 and margin <= margin_gapless  # the price: less in hand at the later starts
    # with the caller's earlier audio still in hand nobody waits for the first words: both plan the whole request
    assert simulate_request(cfg, rates, lengths, start_s, queued=2.0, eos_step=True, options=earliest) == \
        simulate_request(cfg, rates, lengths, start_s, queued=2.0, eos_step=True)


def test_the_plan_follows_the_live_speed_of_the_sentence_s_tokens():
    """Pacer.live: from LIVE_MIN_TOKENS tokens on, every speed of the plan follows how much slower this sentence's
    tokens are than the recent medians, within LIVE_MAX, never faster; the windows' estimate for the measured
    slowdown counts the live speed (so that slowdown does not count it twice)."""
    rates = rates_of(0.010, 0.0079, 0.06)
    pacer = Pacer(SynthesisConfig(), rates, 1.0, MARGIN, XF, HOP_S)
    pacer.live(3 * 0.02, 3)  # too few tokens to tell
    pacer._plan()
    assert pacer.token_s == pytest.approx(0.010) and pacer.live_ratio == 1.0
    pacer.live(6 * 0.016, 6)
    pacer._plan()
    assert pacer.live_ratio == pytest.approx(1.6)
    assert (pacer.token_s, pacer.frame_s, pacer.latent_s) == pytest.approx((0.016, 0.0079 * 1.6, 0.06 * 1.6))
    assert pacer.estimate(10) == pytest.approx(10 * 0.016 + 1.6 * (0.06 + 0.0079 * (20 + MARGIN + XF + 8)))
    pacer.live(4 * 0.001, 4)  # faster than measured: the medians (a sentence's first tokens are its cheapest)
    pacer._plan()
    assert pacer.live_ratio == 1.0 and pacer.token_s == pytest.approx(0.010)
    pacer.live(4 * 1.0, 4)
    assert pacer.live_ratio == pytest.approx(pacing.LIVE_MAX)
    off = Pacer(SynthesisConfig(), rates, 1.0, MARGIN, XF, HOP_S, options=PacingOptions(live=False))
    off.live(6 * 0.016, 6)
    assert off.live_ratio == 1.0


@pytest.mark.parametrize("factor", [1.3, 1.5])
def test_a_machine_slowed_since_its_speeds_were_measured_keeps_up_on_its_live_speed(factor):
    """A co-tenant started after the speeds were measured (idle): every token and window ``factor`` times slower
    from the stream's start, no window measured slower yet. Planned on the medians the stream runs dry; on the live
    speed of its own tokens it keeps up."""
    cfg = SynthesisConfig()
    rates = rates_of(0.010, 0.0079, 0.06)
    _, stale, sizes = simulate_request(cfg, rates, [100], 0.0, slow=[factor], pause=False)
    assert stale < 0, sizes
    first, margins, plans, _ = simulate_timeline(cfg, rates, [100], 0.0, slow=[factor], pause=False, live=True)
    assert min(margins) >= 0, plans
    assert rates.slowdown == 1.0  # (the medians as measured: the live speed alone made the difference)


@pytest.mark.parametrize("bound", [0.8, 1.5])
def test_max_wait_bounds_the_first_audio_and_every_gap(bound):
    """PRIMESPEECH_STREAM_MAX_WAIT: on a machine slower than real time the gapless plan holds the whole sentence
    back; with the bound the first audio comes within it and no later wait is longer, the waits fewer than the
    pieces."""
    cfg = SynthesisConfig()
    slow = rates_of(0.020, 0.012, 0.10)  # 44 ms of work per 40 ms of audio: no plan avoids waiting
    first_gapless, _, plans = simulate_request(cfg, slow, [150], 0.0, pause=False)
    assert first_gapless > 2 * bound  # (its first piece covers most of the sentence)
    options = PacingOptions(max_wait_s=bound)
    first, margins, plans, _ = simulate_timeline(cfg, slow, [150], 0.0, pause=False, options=options)
    since = slow.token_s  # the first token: when the pacer first looks (the engine: the request's start)
    assert first <= since + bound + 1e-9
    assert min(margins) >= -bound - 1e-9, margins
    gaps = [m for m in margins if m < 0]
    assert len(gaps) < len(margins), plans
    with pytest.raises(ConfigError):
        PacingOptions(max_wait_s=-1)


def test_max_wait_leaves_a_machine_that_keeps_up_alone():
    """Where the plan keeps up, the bound changes nothing."""
    cfg = SynthesisConfig()
    for rates in (SLOW, FAST):
        assert simulate(cfg, rates, 120, expected=120) == simulate(cfg, rates, 120, expected=120,
                                                                  options=PacingOptions(max_wait_s=3.0))
