"""A stream window's text encoder and flow (MLX, its matrix products on the BLAS) alone and beside a vocoder run in
the engine's lane, with the BLAS kept to one thread while the lane works (the default, the runtime's ``hold_blas``) and
without.

``python tests/tools/beside_lane.py --threads 2 [--runs 8] [--rounds 2] [--models $REF_BIG]``

Uses the real-size random-weight set of the compare tools (``$REF_BIG``, see shared/tools/compare/README.md)
through the engine: one window of 40 new tokens (16 of context, 4 held back) of a real sentence, its ``window_latent``
timed alone, then while the lane vocodes a latent of twice that window's frames. ``--rounds`` alternates the two
settings. Prints the medians per setting and round, and the lane's vocoder seconds. Not a test.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--runs", type=int, default=8)
ap.add_argument("--rounds", type=int, default=2)
ap.add_argument("--models", default=None)
A = ap.parse_args()
os.environ["PRIMESPEECH_THREADS"] = str(A.threads)

import numpy as np  # noqa: E402
from ref_big import model_dir_with_big, models_dir  # noqa: E402

from dora_primespeech_mlx import _blas  # noqa: E402
from dora_primespeech_mlx.engine import GPTSoVITSEngine, core, streaming  # noqa: E402
from dora_primespeech_mlx.engine.stats import Timer  # noqa: E402

md = model_dir_with_big(models_dir(A.models), "besidelane-")
eng = GPTSoVITSEngine(model_dir=md)
eng.load_voice("Big")
eng.synthesize("今天的天气特别好。", voice="Big", text_lang="all_zh")  # warm: speeds, compiled paths
r = eng._prepare("今天的天气特别好，我们一起去公园里散步聊天吧。", "Big", None, {"text_lang": "all_zh"}, Timer(), None)
models, ref, chunk, cfg = r.models, r.ref, r.chunks[0], r.cfg
tokens = [int(t) for t in np.random.default_rng(0).integers(0, 1000, 100)]
bank = eng.noise_bank((1, 0), models.prior_channels)
lane = eng._lane_for(models)
if lane is None:
    raise SystemExit(f"no vocoder lane at --threads {A.threads} (PRIMESPEECH_OVERLAP): nothing to measure")
backend = models.sovits.vocoder_backend


def latent():
    stitcher = streaming.Stitcher(models.hop, 1.0, 64)
    stitcher.planned_tokens = stitcher.done_tokens = 40
    t0 = time.perf_counter()
    window = streaming.window_latent(models, ref, chunk, cfg, stitcher, bank, tokens[:84], False)
    return time.perf_counter() - t0, window


z = np.asarray(latent()[1].z)
z = np.concatenate([z, z], axis=2)
print(f"BLAS {_blas.thread_settings()}; lane vocoder latent {z.shape[2]} frames")
for rnd in range(A.rounds):
    for hold in (False, True):
        lane.on_busy = functools.partial(core._lane_busy, eng.threads, hold)  # as the runtime's hold_blas does
        alone, beside, vocoder = [], [], []
        for _ in range(A.runs):
            alone.append(latent()[0])
            future = lane.submit(backend, z, ref.ge)
            time.sleep(0.01)  # (the lane's run has begun)
            beside.append(latent()[0])
            vocoder.append(future.result()[1])
        print(f"round {rnd + 1} BLAS {'held to one thread' if hold else 'keeps its threads':20s}: window latent alone "
              f"{statistics.median(alone) * 1e3:.0f} ms, beside the lane {statistics.median(beside) * 1e3:.0f} ms "
              f"(max {max(beside) * 1e3:.0f}); the lane's vocoder {statistics.median(vocoder):.2f} s")
