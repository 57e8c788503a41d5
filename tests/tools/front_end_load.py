"""What the English and Chinese text front ends spend when they load, part by part, each sequence in a fresh
process: ``python tests/tools/front_end_load.py [--runs 3]``. Prints seconds (median of the runs) and each part's
share of its sequence: English as it loads now and as it loaded before (inflect with typeguard's instrumentation,
NLTK's CMU dictionary that g2p_en's constructor parses, the dictionaries parsed instead of read prepared), and
Chinese. Offline data: NLTK_DATA and PRIMESPEECH_TEXT_DATA (../shared's copies when unset, as tests/conftest.py)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"

# Each sequence runs in one fresh process, its steps in order (each step's time excludes the ones before it).
SEQUENCES = {
    "en, before": [
        ("import inflect (typeguard instruments its engine class)", "import inflect"),
        ("import nltk", "import nltk"),
        ("g2p_en's G2p() (parses NLTK's CMU dictionary)", "from g2p_en import G2p; G2p()"),
        ("upstream's dictionaries, parsed", "from pathlib import Path; from dora_primespeech_mlx.text import "
                                            "english; english._english_dictionary(Path(DATA), None)"),
        ("NLTK tagger", "nltk.pos_tag(['hello'])"),
    ],
    "en, now": [
        ("import inflect, uninstrumented", "from dora_primespeech_mlx.text.en_normalization import import_inflect; "
                                           "import_inflect()"),
        ("import nltk", "import nltk"),
        ("g2p_en's model without NLTK's CMU dictionary", "from dora_primespeech_mlx.text.english import "
                                                         "_g2p_en_model; _g2p_en_model()"),
        ("upstream's dictionaries, prepared copy", "from pathlib import Path; from dora_primespeech_mlx.text import "
                                                   "english; english._english_dictionary(Path(DATA), Path(CACHE))"),
        ("NLTK tagger", "nltk.pos_tag(['hello'])"),
    ],
    "zh": [
        ("import pypinyin", "import pypinyin"),
        ("jieba dictionary", "import jieba_fast; jieba_fast.initialize()"),
        ("jieba POS dictionary", "import jieba_fast.posseg"),
    ],
}


def timed(steps: list[tuple[str, str]], env: dict, data: str, cache: str) -> list[float]:
    lines = ["import time", "times = []"]
    for _name, code in steps:
        code = code.replace("DATA", repr(data)).replace("CACHE", repr(cache))
        lines += ["t = time.perf_counter()", code, "times.append(time.perf_counter() - t)"]
    lines.append("print(times)")
    out = subprocess.run([sys.executable, "-c", "\n".join(lines)], capture_output=True, text=True, env=env,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.setdefault("NLTK_DATA", str(SHARED / "nltk_data"))
    data = env.setdefault("PRIMESPEECH_TEXT_DATA", str(SHARED / "data" / "gpt-sovits-text"))
    results = {}
    with tempfile.TemporaryDirectory() as cache:
        timed(SEQUENCES["en, now"], env, data, cache)  # writes the prepared copy
        for label, steps in SEQUENCES.items():
            runs = [timed(steps, env, data, cache) for _ in range(args.runs)]
            results[label] = [statistics.median(run[i] for run in runs) for i in range(len(steps))]
    print(f"1-min load average {os.getloadavg()[0]:.1f}; median of {args.runs} fresh processes each")
    for label, steps in SEQUENCES.items():
        total = sum(results[label])
        print(f"{label}: {total:.2f} s")
        for (name, _code), s in zip(steps, results[label]):
            print(f"  {name:<56} {s:6.2f} s {s / total:6.1%}")
    before, now = sum(results["en, before"]), sum(results["en, now"])
    print(f"en now / before: {now / before:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
