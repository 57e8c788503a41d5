"""How early can a stream's first audio be, with no gap after it? The pacer's own timing model (engine/pacing.py:
the GPT and SoVITS one after another, each window ready a safety margin before it is needed), for one sentence at
given speeds: the first piece while covering with later windows of ``stream_chunk_tokens``, with the pacer's plan
(the last windows shrinking, :meth:`Pacer.windows`; it works to ``TAPER_HEADROOM`` times the expected length), and
with the best schedule in the same model (a dynamic programme over every window size, to exactly the expected
length). Not a test: arithmetic behind docs/performance.md.

    python tests/tools/first_audio_bound.py --token-s 0.0164 --frame-s 0.0107 --latent-s 0.098 --start-s 0.6

The speeds are a stream's ``stream_rates`` (``python tests/tools/stream_keeps_up.py`` prints them); ``--start-s``:
the seconds before the first token (BERT and the prefill). Prints, per sentence length, the first audio F and the
window sizes of both plans.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's package

from dora_primespeech_mlx.engine import pacing  # noqa: E402
from dora_primespeech_mlx.engine.config import SynthesisConfig  # noqa: E402


def pacer_for(args, tokens: int) -> pacing.Pacer:
    rates = pacing.StreamRates()
    rates.note_tokens(args.token_s, 1)
    rates.note_vocoder(args.frame_s, 1, window=True)
    rates.note_latent(args.latent_s, window=True)
    return pacing.Pacer(SynthesisConfig(), rates, 1.0, args.margin_frames, args.crossfade_frames, 640 / 32000,
                        expected_tokens=tokens)


def first_audio(p: pacing.Pacer, first: int, start_s: float) -> float:
    return start_s + first * p.token_s + p.cost(first)


def best_schedule(p: pacing.Pacer, total: int, smallest: int = 2) -> list[int]:
    """The smallest first piece after which some schedule of windows keeps up, and that schedule: for each first
    piece, a dynamic programme keeping the most audio in hand after each token count (the timing model's slack)."""
    top = p.cfg.stream_chunk_tokens
    for first in range(p.cfg.stream_first_tokens, total + 1):
        if first == total:
            return [total]
        none = float("-inf")
        slack, size = [none] * (total + 1), [0] * (total + 1)
        slack[first] = p._audio(first, True, False)  # in hand when the first piece starts playing
        for k in range(first + 1, total + 1):
            for n in range(smallest, min(top, k - first) + 1):
                s = slack[k - n]
                cost = p.cost(n)
                if s == none or s - n * p.token_s - cost < pacing.SAFETY_S + pacing.SAFETY_FRACTION * cost:
                    continue
                after = s - n * p.token_s - cost + p._audio(n, False, k == total)
                if after > slack[k]:
                    slack[k], size[k] = after, n
        if slack[total] != none:
            sizes, k = [], total
            while k > first:
                sizes.insert(0, size[k])
                k -= size[k]
            return [first, *sizes]
    return [total]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--token-s", type=float, required=True, help="GPT seconds per token (stream_rates token_s)")
    ap.add_argument("--frame-s", type=float, required=True, help="vocoder seconds per latent frame (frame_s)")
    ap.add_argument("--latent-s", type=float, required=True, help="SoVITS seconds per window up to the vocoder")
    ap.add_argument("--start-s", type=float, default=0.6, help="seconds before the first token (BERT, prefill)")
    ap.add_argument("--margin-frames", type=int, default=SynthesisConfig().stream_vocoder_margin)
    ap.add_argument("--crossfade-frames", type=int, default=1)
    ap.add_argument("--tokens", default="60,100,150,250", help="sentence lengths in tokens")
    args = ap.parse_args()
    for total in (int(t) for t in args.tokens.split(",")):
        p = pacer_for(args, total)
        if not p.covering:
            print(f"{total} tokens: the pacer does not cover at these speeds (windows gain on the listener)")
            continue
        plans = []
        for name, tail in (("windows of stream_chunk_tokens", None), (f"the pacer's (tail {p.tail})", p.tail)):
            end = total if tail is None else p._end()  # a plan with a tail works to TAPER_HEADROOM more
            first = p._covering_first(end, tail=tail)
            plan = [first, *p.windows(end - first, tail)]
            plans.append(f"{name} F = {first_audio(p, first, args.start_s):.2f} s {plan}")
        best = best_schedule(p, total)
        print(f"{total} tokens: " + "; ".join(plans) +
              f"; the best schedule F = {first_audio(p, best[0], args.start_s):.2f} s {best}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
