"""Where cutting the vocoder pays, and how its threads are best spent: for latents of several lengths, the ONNX
Runtime generator in several configurations, alternating, medians. A configuration is ``PxK-LAYOUT[-spin]``: the
latent cut into ``P`` stretches run at once (the receptive field as margin, ``models/vocoder_split``), each on a
session with ``K`` intra-op threads and the ``LAYOUT`` graph (``1d`` or ``2d``); ``-spin`` lets the intra-op threads
spin between convolutions (the package's sessions do not). ``1x2-1d`` is one run on two intra-op threads, what
``PRIMESPEECH_VOCODER_PARTS=1`` gives at two threads; ``2x1-2d`` the cut in two that ``auto`` gives there. Each
length prints the largest difference from the first configuration's samples: 0 between configurations of one layout
(a cut is exact), float rounding (~1e-6) between the two layouts.

``python tests/tools/vocoder_cut_sweep.py [--runs 5] [--frames 24,48,80,120,160,200,300,400]
[--configs 1x2-1d,2x1-2d]`` on the bench's real-size v2 generator (random weights, written once by
``primespeech-mlx bench``). Pin it to as many cores as the configurations use (``taskset``). Prints one line per
length and one ``CUTSWEEP {json}`` line. Not a test."""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time

import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("--runs", type=int, default=5)
ap.add_argument("--frames", default="24,48,80,120,160,200,300,400")
ap.add_argument("--configs", default="1x2-1d,2x1-2d", help="comma list of PxK-LAYOUT[-spin]; the first is the base")
A = ap.parse_args()
CONFIG = re.compile(r"^(\d+)x(\d+)-(1d|2d)(-spin)?$")
configs = [c.strip() for c in A.configs.split(",") if c.strip()]
for c in configs:
    if not CONFIG.match(c):
        ap.error(f"configuration {c!r}: expected PxK-LAYOUT[-spin], e.g. 2x1-2d or 1x4-1d-spin")

from dora_primespeech_mlx.bench.measure import _preload_blas  # noqa: E402

_preload_blas()
from dora_primespeech_mlx.bench.weights import default_models_dir, ensure_models  # noqa: E402
from dora_primespeech_mlx.convert import load  # noqa: E402
from dora_primespeech_mlx.models.sovits import vocoder_onnx, vocoder_split  # noqa: E402

root = ensure_models(default_models_dir())
sovits = load.load_sovits(root / "sovits")
margin = sovits.dec.receptive_frames
vocoder_split.MIN_FRAMES_PER_MARGIN = 1  # cut every length (the sweep finds where it pays)
graphs = {layout: vocoder_onnx.load_or_build(sovits.dec, root / "sovits", threads=1, layout=layout).path
          for layout in {CONFIG.match(c).group(3) for c in configs}}
runners = {}
for c in configs:
    parts, threads, layout, spin = CONFIG.match(c).groups()
    session = vocoder_onnx.OnnxGenerator(graphs[layout], int(threads), spin=bool(spin))
    runners[c] = vocoder_split.SplitRunner(session, int(parts), margin, sovits.samples_per_frame) \
        if int(parts) > 1 else session
base = configs[0]
rng = np.random.default_rng(0)
first = next(iter(runners.values()))
session0 = first.fn.session if isinstance(first, vocoder_split.SplitRunner) else first.session
channels, gin = int(session0.get_inputs()[0].shape[1]), int(session0.get_inputs()[1].shape[1])
ge = rng.standard_normal((1, gin, 1)).astype(np.float32)
rows = []
for frames in (int(f) for f in A.frames.split(",")):
    z = rng.standard_normal((1, channels, frames)).astype(np.float32)
    want = runners[base](z, ge)
    diff = max(float(np.abs(want - fn(z, ge)).max()) for fn in runners.values())
    seconds: dict[str, list[float]] = {c: [] for c in configs}
    for _ in range(A.runs):
        for c, fn in runners.items():
            t = time.perf_counter()
            fn(z, ge)
            seconds[c].append(time.perf_counter() - t)
    ms = {c: round(statistics.median(v) * 1e3) for c, v in seconds.items()}
    rows.append({"frames": frames, "margins": round(frames / margin, 1), "ms": ms,
                 "over_base": {c: round(ms[c] / max(1, ms[base]), 2) for c in configs}, "max_diff": diff})
    print(f"{frames} frames ({frames / margin:.1f} margins): " + ", ".join(f"{c} {ms[c]} ms" for c in configs)
          + f"; largest difference {diff:.1e}", flush=True)
print("CUTSWEEP " + json.dumps({"margin_frames": margin, "runs": A.runs, "configs": configs, "rows": rows}))
