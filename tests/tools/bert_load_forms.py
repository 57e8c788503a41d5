"""How long RoBERTa's load takes from the converted float32 file (``convert.load.load_bert``: read, check that every
weight is a float16 value, store it as float16), from its prepared form (the same load reading what the first one
wrote under ``prepared/``, ``PRIMESPEECH_PREPARED_CACHE``), and reading a float16 copy of the weights alone (no model
built), each in a fresh process, alternated; the bench's real-size model (``bench/weights.py``). Not a test: the
figure behind docs/performance.md ("Start-up").

    python tests/tools/bert_load_forms.py --runs 3
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # this checkout's package

from dora_primespeech_mlx.bench.weights import default_models_dir, ensure_models  # noqa: E402

PROBE = """
import sys, time
from dora_primespeech_mlx.bench.measure import _preload_blas, bench_runtime
_preload_blas()
import mlx.core as mx
from dora_primespeech_mlx.convert import load
root, form, copy, prepared = sys.argv[1:5]
t = time.perf_counter()
if form in ("float32", "prepared"):
    load.load_bert(root + "/bert", root=root, runtime=bench_runtime(),
                   prepared=prepared if form == "prepared" else None)
else:
    mx.eval(list(mx.load(copy).values()))
print(time.perf_counter() - t)
"""

WRITE = """
import sys
import mlx.core as mx
w = mx.load(sys.argv[1])
mx.save_safetensors(sys.argv[2], {k: v.astype(mx.float16) if v.ndim == 2 and v.size >= 1 << 16 else v
                                   for k, v in w.items()})
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    root = ensure_models(default_models_dir())
    seconds: dict[str, list[float]] = {"float32": [], "prepared": [], "float16": []}
    with tempfile.TemporaryDirectory() as d:
        copy, prepared = str(Path(d) / "bert16.safetensors"), str(Path(d) / "prepared")
        subprocess.run([sys.executable, "-c", WRITE, str(root / "bert" / "model.safetensors"), copy], check=True)
        subprocess.run([sys.executable, "-c", PROBE, str(root), "prepared", copy, prepared], check=True,
                       capture_output=True)  # the first load writes the prepared form
        for _ in range(args.runs):
            for form in seconds:
                out = subprocess.run([sys.executable, "-c", PROBE, str(root), form, copy, prepared], check=True,
                                     capture_output=True, text=True)
                seconds[form].append(float(out.stdout.strip().splitlines()[-1]))
    for form, s in seconds.items():
        print(f"{form}: {', '.join(f'{x:.2f}' for x in s)} s (median {statistics.median(s):.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
