"""The CPU stages' product paths (models/kernels/cpu_paths.py) side by side, alternated in one process on the bench's
real-size random-weight models (``primespeech-mlx bench`` builds them): not a test, a script printing numbers.
It measures the figures behind ``cpu_paths.DEFAULTS`` for the kernel build in use (``PRIMESPEECH_ISA`` forces one).

    PRIMESPEECH_THREADS=1 python tests/models/bench_cpu_paths.py [-n 8] [--no-mlx]
    PRIMESPEECH_THREADS=2 PRIMESPEECH_ISA=avx2 python tests/models/bench_cpu_paths.py

Rows, min and median of n alternating rounds, wall and process CPU time (on a shared machine the CPU time of a
one-thread run is the steadier figure):
- GPT prefill (71 phones + 139 prompt tokens) with float16 weights: the float16 GEMM, BLAS on the weights upcast
  per call, and the float32-weight model (numpy prefill);
- RoBERTa, 23 tokens, float16 weights in numpy: the float16 GEMM, BLAS on upcast weights; float32 MLX (unless
  ``--no-mlx``: it loads a second, 1.2 GB copy).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's package


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=8, help="alternating rounds (default 8)")
    ap.add_argument("--no-mlx", action="store_true", help="skip the float32 MLX RoBERTa")
    args = ap.parse_args()

    from dora_primespeech_mlx.bench import measure
    from dora_primespeech_mlx.bench import weights as bench

    measure._preload_blas()
    import mlx.core as mx

    from dora_primespeech_mlx.convert import load
    from dora_primespeech_mlx.models.gpt.numpy_decoder import NumpyDecoder
    from dora_primespeech_mlx.models.kernels import cpu_paths, half_gemv
    from dora_primespeech_mlx.runtime import Runtime

    root = bench.ensure_models(bench.default_models_dir())
    print(f"loadavg {os.getloadavg()} | kernels {half_gemv.library_status()}")
    if half_gemv.library() is None:
        print("no float16 kernels here: nothing to compare")
        return 1
    rng = np.random.default_rng(0)
    gpt = load.load_gpt(root / "gpt")
    phones, feats, prompt = bench.gpt_inputs(gpt, rng)
    full = NumpyDecoder(gpt, half=False)
    half = {p: NumpyDecoder(gpt, runtime=Runtime(gpt_prefill=p)) for p in ("float16", "float32")}  # same weights
    bert, _ = load.load_bert(root / "bert")
    ids = mx.array(rng.integers(5, bert.args.vocab_size, (1, bench.N_BERT_TOKENS)).astype(np.int32))

    def prefill(path):
        return lambda: half[path].prefill(phones, feats, prompt, 1)

    def roberta(path):
        def run():
            bert.fast_path().gemm = path  # the numpy forward's products (bert/numpy_encoder.py)
            mx.eval(bert(ids))
        return run

    variants = {
        "GPT prefill, float16 GEMM": prefill("float16"),
        "GPT prefill, BLAS on upcast weights": prefill("float32"),
        "GPT prefill, float32-weight model": lambda: full.prefill(phones, feats, prompt, 1),
        "RoBERTa, float16 GEMM": roberta("float16"),
        "RoBERTa, BLAS on upcast weights": roberta("float32"),
    }
    if not args.no_mlx:
        bert32, _ = load.load_bert(root / "bert", runtime=Runtime(bert_half=False))
        variants["RoBERTa, float32 MLX"] = lambda: mx.eval(bert32(ids))
    for fn in variants.values():
        fn()  # warm-up
    wall: dict[str, list[float]] = {k: [] for k in variants}
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.n):
        for name, fn in variants.items():
            t, c = time.perf_counter(), time.process_time()
            fn()
            wall[name].append((time.perf_counter() - t) * 1e3)
            cpu[name].append((time.process_time() - c) * 1e3)
    print(f"{'':38} {'wall min / median ms':>22} {'CPU min / median ms':>22}   (n={args.n}, threads "
          f"{half_gemv.threads()}, build {half_gemv.isa()}, loadavg {os.getloadavg()[0]:.1f})")
    for name in variants:
        w, c = wall[name], cpu[name]
        print(f"{name:38} {min(w):10.1f} / {np.median(w):9.1f} {min(c):10.1f} / {np.median(c):9.1f}")
    print("defaults here:", {k: v[0] for k, v in cpu_paths.chosen().items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
