"""First English sentence after warm-up vs a later one (issue 13: the warm-up must cover English).

    python tests/tools/first_sentence.py [--trials 6] [--no-warmup]

Each trial is a fresh process (the first-sentence cost is per process): it loads the fixture voice
(tests/node/tiny_voice.py, an English voice with random weights), runs ``engine.warmup()`` as the node does
before ``ready`` (unless ``--no-warmup``), then synthesises two different English sentences and prints the
time of each, whole and in the text front end (``timings["text"]``). Odd trials speak A then B, even
trials B then A, so the two sentences' own costs cancel out. The summary gives the medians of "first" and
"later" and their difference in %.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "tests" / "node")]  # this checkout's package
SENTENCES = ("The quick brown fox jumps over the lazy dog near the river bank.",
             "Several old friends gathered at noon to talk about their summer plans.")


def trial(order: int, warmup: bool) -> dict:
    from tiny_voice import VOICE, make_model_dir

    from dora_primespeech_mlx.engine import GPTSoVITSEngine

    model_dir = make_model_dir(Path(tempfile.mkdtemp(prefix="first-sentence-")) / "models")
    engine = GPTSoVITSEngine(model_dir=model_dir, device="cpu", encoders="mlx")
    engine.load_voice(VOICE)
    t0 = time.perf_counter()
    front_ends = engine.warmup() if warmup else {}
    warm_s = time.perf_counter() - t0
    texts = SENTENCES if order == 0 else SENTENCES[::-1]
    out = {"order": order, "warmup_s": round(warm_s, 3), "front_ends": front_ends, "runs": []}
    for text in texts:
        t0 = time.perf_counter()
        result = engine.synthesize(text, text_lang="en", top_k=1)
        out["runs"].append({"text": text[:20], "total_s": time.perf_counter() - t0,
                            "text_s": float(result.timings.get("text", float("nan"))),
                            "audio_s": len(result.audio) / result.sample_rate})
    return out


def front_end_trial(order: int, warmup: bool) -> dict:
    """A Chinese voice's case, in the text front end alone (the fixture voice cannot speak Chinese): warm the
    front ends a ``zh`` voice warms (``warm_up("zh")``: Chinese and English), then time two English
    sentences through ``preprocess``."""
    from conftest import load_text_data  # (NLTK_DATA / PRIMESPEECH_TEXT_DATA from ../shared, as the tests use them)

    from dora_primespeech_mlx.text.frontend import preprocess
    from dora_primespeech_mlx.text.warmup import warm_up

    data = load_text_data()

    t0 = time.perf_counter()
    front_ends = warm_up("zh", data=data) if warmup else {}
    out = {"order": order, "warmup_s": round(time.perf_counter() - t0, 3), "front_ends": front_ends, "runs": []}
    for text in (SENTENCES if order == 0 else SENTENCES[::-1]):
        t0 = time.perf_counter()
        preprocess(text, "en", "cut5", "v2", data=data)
        dt = time.perf_counter() - t0
        out["runs"].append({"text": text[:20], "total_s": dt, "text_s": dt, "audio_s": 0.0})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--front-end", action="store_true",
                    help="a zh voice's warm-up (Chinese + English front ends), then English through the front end only")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        run = front_end_trial if args.front_end else trial
        print(json.dumps(run(args.child, not args.no_warmup)))
        return 0
    results = []
    for i in range(args.trials):
        cmd = [sys.executable, __file__, "--child", str(i % 2)] + (["--no-warmup"] if args.no_warmup else [])
        cmd += ["--front-end"] if args.front_end else []
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=True)
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        results.append(res)
        first, later = res["runs"]
        print(f"trial {i + 1} (order {'AB' if res['order'] == 0 else 'BA'}): warm-up {res['warmup_s']:.2f} s; "
              f"first {first['total_s']:.3f} s (text {first['text_s']:.3f} s), "
              f"later {later['total_s']:.3f} s (text {later['text_s']:.3f} s)", flush=True)
    for key in ("total_s", "text_s"):
        first = statistics.median(r["runs"][0][key] for r in results)
        later = statistics.median(r["runs"][1][key] for r in results)
        print(f"median {key[:-2]:5}: first {first:.3f} s, later {later:.3f} s, first vs later "
              f"{(first / later - 1) * 100:+.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
