"""The first text after a whole warm-up synthesis against one capped at ``engine.core.warmup_tokens`` tokens, each in
a fresh process, alternated; the bench's real-size voice (``bench/weights.py``: its ``你好。`` decodes 100 tokens).
Each process loads the front ends and the voice, warms up (whole or capped), then streams the first text ``你好。``
and prints the warm-up's seconds, the first text's first audio and its gaps (a player that starts at the first chunk
and plays each chunk when it has come), both counted from the end of the warm-up. Not a test: the figures behind
docs/performance.md ("Start-up").

    python tests/tools/warmup_cap.py --rounds 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # this checkout's package

from dora_primespeech_mlx.bench.weights import default_models_dir, ensure_models  # noqa: E402

PROBE = r"""
import json, sys, time
from dora_primespeech_mlx.bench.measure import _preload_blas, bench_runtime
_preload_blas()
from dora_primespeech_mlx.bench.weights import bench_voice
from dora_primespeech_mlx.engine import GPTSoVITSEngine, core
from dora_primespeech_mlx.text.warmup import warm_up
root, form = sys.argv[1], sys.argv[2]
if form == "whole":
    core.warmup_tokens = lambda config: None
from pathlib import Path
eng = GPTSoVITSEngine(model_dir=Path(root), runtime=bench_runtime())
spec = bench_voice(Path(root))
warm_up(spec.language, data=eng.text_data)
eng.load_voice(spec)
t0 = time.perf_counter()
eng.warmup()
t1 = time.perf_counter()
first, gaps, end = None, 0.0, 0.0
for chunk in eng.synthesize_stream("你好。"):
    now = time.perf_counter() - t1
    if first is None:
        first = end = now
    elif now > end:
        gaps, end = gaps + now - end, now
    end += chunk.duration
print(json.dumps({"warmup_s": t1 - t0, "first_audio_s": first, "gaps_s": gaps, "played_until_s": end}))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=4)
    args = p.parse_args()
    root = ensure_models(default_models_dir())
    rows: dict[str, list[dict]] = {"whole": [], "capped": []}
    for r in range(args.rounds):
        for form in (("whole", "capped") if r % 2 == 0 else ("capped", "whole")):
            out = subprocess.run([sys.executable, "-c", PROBE, str(root), form], check=True, capture_output=True,
                                 text=True)
            rows[form].append(json.loads(out.stdout.strip().splitlines()[-1]))
            with open("/proc/loadavg") as f:
                load = f.read().split()[0]
            print(form, {k: round(v, 2) for k, v in rows[form][-1].items()}, f"load {load}", flush=True)
    for form, got in rows.items():
        med = {k: round(statistics.median(x[k] for x in got), 2) for k in got[0]}
        print(f"{form}: medians {med}, runs with a gap: {sum(x['gaps_s'] > 0 for x in got)} of {len(got)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
