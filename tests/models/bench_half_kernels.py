"""Before/after of the float16 kernels (models/kernels/half_gemv.py), alternated in one process on the bench's real-size
random-weight models (``primespeech-mlx bench`` builds them): not a test, a script printing numbers.

    PRIMESPEECH_THREADS=1 python tests/models/bench_half_kernels.py [-n 5]

Rows, each "before" (what the package did before these kernels) against "after" (what it does now):
- RoBERTa, 23 tokens: float32 weights on MLX vs float16 weights through numpy + the GEMM kernel;
- GPT prefill (71 phones + 139 prompt tokens): float16 weights upcast per layer + BLAS vs the GEMM kernel;
- GPT decode step: numpy with one gemv call per product on one thread vs every block in one kernel call
  (``decode_layers``) on the configured threads (they follow PRIMESPEECH_THREADS; "after" at 1 and 2 threads
  when it is 2).
The loadavg is printed before and after: the machine may be shared.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's package


def _timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def _row(name: str, samples: dict[str, list[float]], unit: str = "ms") -> None:
    base = samples.get("before")
    parts = []
    for k, v in samples.items():
        ratio = f" ({np.min(base) / np.min(v):.2f}x)" if base is not None and k != "before" else ""
        parts.append(f"{k}: min {np.min(v):.2f} med {np.median(v):.2f} {unit}{ratio}")
    print(f"{name:<22} " + " | ".join(parts), flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-n", type=int, default=5, help="rounds (each alternates all variants)")
    p.add_argument("--models-dir", help="bench models (default: the bench's cache folder)")
    args = p.parse_args(argv)

    from dora_primespeech_mlx import bench as bench_cli
    from dora_primespeech_mlx.bench import weights as bench

    bench_cli._preload_blas()
    import mlx.core as mx

    from dora_primespeech_mlx import _blas
    from dora_primespeech_mlx.convert import load
    from dora_primespeech_mlx.models.gpt import numpy_decoder as t2s_numpy
    from dora_primespeech_mlx.models.kernels import half_gemv
    from dora_primespeech_mlx.runtime import Runtime

    root = bench.ensure_models(bench.default_models_dir() if args.models_dir is None else args.models_dir)
    threads = half_gemv.threads()
    kernels = half_gemv.library()
    print(f"loadavg {os.getloadavg()} | BLAS {_blas.thread_settings()} | kernels {half_gemv.library_status()}")

    rng = np.random.default_rng(0)
    bert32, _ = load.load_bert(root / "bert", runtime=Runtime(bert_half=False))
    bert16, _ = load.load_bert(root / "bert")
    assert bert16.fast_path() is not None, "float16 BERT path unavailable"
    ids = mx.array(rng.integers(5, bert32.args.vocab_size, (1, bench.N_BERT_TOKENS)).astype(np.int32))
    a, b = np.array(bert32(ids)), np.array(bert16(ids))
    print(f"BERT float16 vs float32: max |diff| {np.abs(a - b).max():.3g} (max |x| {np.abs(a).max():.3g})")

    gpt = load.load_gpt(root / "gpt")
    dec = gpt.decoder
    assert getattr(dec, "half", False), "float16 GPT decode unavailable"
    phones, feats, prompt = bench.gpt_inputs(gpt, rng)
    new_linear, new_ffn = t2s_numpy._linear, t2s_numpy._ffn

    def old_linear(x, w, b, relu=False, path=None):  # before: upcast the float16 weight, then BLAS
        y = x @ w.T + b
        if relu:
            np.maximum(y, 0, out=y)
        return y

    def old_ffn(layer, x, h):  # before: separate gemv calls (with the numpy step: fused_step False)
        hh = layer.fc1_w @ x + layer.fc1_b
        np.maximum(hh, 0, out=hh)
        return layer.fc2_w @ hh

    unfused = t2s_numpy.NumpyDecoder(gpt, runtime=Runtime(fused_step=False))  # the same weights, numpy's step

    def variant(linear, ffn, n_threads, fused=True):
        def apply():
            t2s_numpy._linear, t2s_numpy._ffn = linear, ffn
            kernels.nthreads = lambda: n_threads  # the library the decoder and BERT share (no plan here)
            return dec if fused else unfused
        return apply

    variants = {"before": variant(old_linear, old_ffn, 1, False), "after": variant(new_linear, new_ffn, threads)}
    if threads > 1:
        variants["after-1thread"] = variant(new_linear, new_ffn, 1)
    res = {k: {"bert": [], "prefill": [], "step": []} for k in variants}
    tokens = rng.integers(0, 1024, bench.N_TOKENS)
    for apply in variants.values():  # warm-up
        d = apply()
        bert16(ids)
        d.prefill(phones, feats, prompt, 1)
    mx.eval(bert32(ids))
    for _ in range(args.n):
        for name, apply in variants.items():
            d = apply()
            model = bert32 if name == "before" else bert16
            res[name]["bert"] += _timed(lambda m=model: mx.eval(m(ids)), 1)
            res[name]["prefill"] += _timed(lambda d=d: d.prefill(phones, feats, prompt, bench.N_TOKENS), 1)
            state = d.prefill(phones, feats, prompt, bench.N_TOKENS)[0]
            for i, tok in enumerate(tokens):
                t = time.perf_counter()
                state.step(int(tok), prompt.shape[1] + i)
                res[name]["step"].append((time.perf_counter() - t) * 1e3)
    t2s_numpy._linear, t2s_numpy._ffn = new_linear, new_ffn
    kernels.nthreads = half_gemv.threads
    print(f"kernel threads (after) {threads}; {args.n} rounds, {bench.N_TOKENS} steps each")
    _row(f"BERT {bench.N_BERT_TOKENS} tokens", {k: v["bert"] for k, v in res.items()})
    _row("GPT prefill", {k: v["prefill"] for k, v in res.items()})
    _row("GPT decode step", {k: v["step"] for k, v in res.items()}, "ms")
    print(f"loadavg {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
