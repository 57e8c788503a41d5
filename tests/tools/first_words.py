"""First words against gaps: a text of several sentences streamed with ``PRIMESPEECH_STREAM_START=gapless`` and
``earliest``, in the pacer's own timing model (tests/engine/test_pacing.py ``simulate_timeline``: the GPT and SoVITS
one after another at fixed speeds, each sentence's end one step after its last token, a player that starts each piece
on arrival or after the one before it).

``python tests/tools/first_words.py [--lengths 100,100,100] [--start-s 0.4]``

Prints, per machine (speeds), for each start: the first audio, the gaps (count, total, worst), when the last audio
has played, and ``first + gaps``: the listener's waiting in all. The request's work is the same either way, so the
end moves little; an earlier first chunk is paid for in gaps. Not a test.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "engine")]  # (tests/conftest.py, tests/engine/test_pacing.py)

from test_pacing import NEAR, SLOW, rates_of, simulate_timeline  # noqa: E402

from dora_primespeech_mlx.engine.config import SynthesisConfig  # noqa: E402
from dora_primespeech_mlx.engine.pacing import PacingOptions  # noqa: E402

XEON = (0.0179, 0.0087, 0.118)  # the 2-core Xeon VM's stream speeds (token_s, frame_s, latent_s; test_pacing.py)
MACHINES = [
    ("Xeon VM speeds x 0.5", rates_of(*(x * 0.5 for x in XEON))),
    ("2-core VM, 1 thread (SLOW)", SLOW),
    ("Xeon VM speeds x 0.7", rates_of(*(x * 0.7 for x in XEON))),
    ("Xeon VM speeds x 0.8", rates_of(*(x * 0.8 for x in XEON))),
    ("near real time (NEAR)", NEAR),
    ("slower than real time", rates_of(0.02, 0.012, 0.1)),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="100,100,100", help="the sentences' tokens (40 ms of audio each)")
    ap.add_argument("--start-s", type=float, default=0.4, help="each sentence's prefill and BERT, seconds")
    args = ap.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    cfg = SynthesisConfig()
    print(f"sentences {lengths}, start {args.start_s} s each")
    print("| machine | start | first audio | gaps (count, total, worst) | last audio played | first + gaps |")
    print("|---|---|---|---|---|---|")
    for name, rates in MACHINES:
        for start in ("gapless", "earliest"):
            first, margins, _, end = simulate_timeline(cfg, rates, lengths, args.start_s, eos_step=True,
                                                       options=PacingOptions(start=start))
            gaps = [-m for m in margins if m < 0]
            print(f"| {name} | {start} | {first:.2f} s | {len(gaps)}, {sum(gaps):.2f} s, {max(gaps, default=0):.2f} s "
                  f"| {end:.2f} s | {first + sum(gaps):.2f} s |")


if __name__ == "__main__":
    main()
