"""Where cutting the vocoder pays: for latents of several lengths, the ONNX Runtime generator cut in two (one-thread
2-D graph, two parts at once, the receptive field as margin) against one run on two intra-op threads (the 1-D
graph), alternating, medians. Same samples both ways (checked per length).

``python tests/tools/vocoder_cut_sweep.py [--runs 5] [--frames 24,48,80,120,160,200,300,400]`` on the bench's
real-size v2 generator (random weights, written once by ``primespeech-mlx bench``). Prints one line per length and
one ``CUTSWEEP {json}`` line. Not a test."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("--runs", type=int, default=5)
ap.add_argument("--frames", default="24,48,80,120,160,200,300,400")
A = ap.parse_args()

from dora_primespeech_mlx.bench.measure import _preload_blas  # noqa: E402

_preload_blas()
from dora_primespeech_mlx.bench.weights import default_models_dir, ensure_models  # noqa: E402
from dora_primespeech_mlx.convert import load  # noqa: E402
from dora_primespeech_mlx.models import vocoder_onnx, vocoder_split  # noqa: E402

root = ensure_models(default_models_dir())
sovits = load.load_sovits(root / "sovits")
wide = vocoder_onnx.load_or_build(sovits.dec, root / "sovits", threads=2)
single = vocoder_onnx.load_or_build(sovits.dec, root / "sovits", threads=1)
margin = sovits.dec.receptive_frames
vocoder_split.MIN_FRAMES_PER_MARGIN = 1  # cut every length (the sweep finds where it pays)
cut = vocoder_split.SplitRunner(single, 2, margin, sovits.samples_per_frame)
rng = np.random.default_rng(0)
channels = int(wide.session.get_inputs()[0].shape[1])
ge = rng.standard_normal((1, int(wide.session.get_inputs()[1].shape[1]), 1)).astype(np.float32)
rows = []
for frames in (int(f) for f in A.frames.split(",")):
    z = rng.standard_normal((1, channels, frames)).astype(np.float32)
    same = bool(np.array_equal(wide(z, ge), cut(z, ge)))
    seconds: dict[str, list[float]] = {"whole": [], "cut": []}
    for _ in range(A.runs):
        for name, fn in (("whole", wide), ("cut", cut)):
            t = time.perf_counter()
            fn(z, ge)
            seconds[name].append(time.perf_counter() - t)
    w, c = statistics.median(seconds["whole"]), statistics.median(seconds["cut"])
    rows.append({"frames": frames, "whole_ms": round(w * 1e3), "cut_ms": round(c * 1e3), "cut_over_whole":
                 round(c / w, 2), "same_samples": same, "margins": round(frames / margin, 1)})
    print(f"{frames} frames ({frames / margin:.1f} margins): two intra-op threads {w * 1e3:.0f} ms, cut in two "
          f"{c * 1e3:.0f} ms, cut / whole {c / w:.2f}, same samples: {same}", flush=True)
print("CUTSWEEP " + json.dumps({"margin_frames": margin, "runs": A.runs, "rows": rows}))
