"""The kernel library of this checkout against the one of another git revision, alternated in one process on the
bench's real-size random-weight GPT (``primespeech-mlx bench`` builds it): not a test, a script printing numbers.

    PRIMESPEECH_THREADS=1 python tests/models/bench_kernel_revisions.py --against HEAD~1 [-n 500]

Both libraries are built from ``csrc/`` (this checkout's, and ``git show REV:...``'s) with the flags of the build in
use (``PRIMESPEECH_ISA`` forces one) and called on the same inputs, one after the other:
- the GPT decode step (``decode_layers``, every block of one step), ``-n`` steps from the prefix of the bench's
  request (71 phones + 139 prompt tokens): median ms per step in bands of 100 cache rows, and the largest
  difference of the two states;
- the prefill's attention (``prefill_attention``) over the 24 layers, the same prefix;
- the small-M GEMM (``gemm_f16``) on the first block's four weights (qkv, out, fc1, fc2) with the prefix's rows
  and with RoBERTa's token count (``bench.N_BERT_TOKENS``): median ms of the four, and the largest difference;
- the whole prefill of this checkout with its residual norms in the library or in numpy (``t2s_numpy._add_norm``
  given no library): a before/after inside this checkout.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's package


def _build(src_dir: Path, out: Path, flags: list[str]) -> ctypes.CDLL:
    from dora_primespeech_mlx import native

    cmd = [native.c_compiler(), "-O2", "-shared", "-fPIC", *flags, f"-I{src_dir}", str(src_dir / "half_gemv.c"),
           "-o", str(out), "-lm"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    lib = ctypes.CDLL(str(out))
    P, I, F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    lib.decode_layers.argtypes = [P, I, I, I, P, P, I, I, I, F, F, ctypes.c_int]
    lib.decode_layers.restype = None
    lib.prefill_attention.argtypes = [P, P, P, P, P, I, I, I, I, I, F, ctypes.c_int]
    lib.prefill_attention.restype = None
    lib.gemm_f16.argtypes = [P, P, P, P, I, I, I, ctypes.c_int, ctypes.c_int]
    lib.gemm_f16.restype = None  # an int in newer revisions: 0, or -1 when out of memory (not expected here)
    return lib


def _sources_at(rev: str, dest: Path) -> None:
    listing = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", rev, "dora_primespeech_mlx/csrc/"],
                             check=True, capture_output=True, text=True).stdout.split()
    for path in listing:
        if path.endswith((".c", ".h")):
            text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"], check=True, capture_output=True,
                                  text=True).stdout
            (dest / Path(path).name).write_text(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--against", required=True, help="git revision whose csrc/ is the 'before' library")
    ap.add_argument("-n", type=int, default=500, help="decode steps (default 500)")
    ap.add_argument("--rounds", type=int, default=20, help="alternating rounds of the prefill rows (default 20)")
    args = ap.parse_args()

    from dora_primespeech_mlx.bench import measure
    from dora_primespeech_mlx.bench import weights as bench

    measure._preload_blas()
    from dora_primespeech_mlx.convert import load
    from dora_primespeech_mlx.models.gpt import numpy_decoder as t2s_numpy
    from dora_primespeech_mlx.models.kernels import half_gemv

    if half_gemv.library() is None:
        print(f"no float16 kernels here: {half_gemv.library_status()['why_not']}")
        return 1
    isa, th = half_gemv.isa(), half_gemv.threads()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "before").mkdir()
        _sources_at(args.against, tmp / "before")
        flags = list(half_gemv.FLAGS[isa])
        libs = {"before": _build(tmp / "before", tmp / "before.so", flags),
                "after": _build(ROOT / "dora_primespeech_mlx" / "csrc", tmp / "after.so", flags)}
        root = bench.ensure_models(bench.default_models_dir())
        rng = np.random.default_rng(0)
        gpt = load.load_gpt(root / "gpt")
        phones, feats, prompt = bench.gpt_inputs(gpt, rng)
        dec = gpt.decoder
        w = dec.weights()
        print(f"build {isa}, {th} thread(s), against {args.against}, loadavg {os.getloadavg()[0]:.1f}")

        states = {k: dec.prefill(phones, feats, prompt, args.n + 1)[0] for k in libs}
        start = states["after"].offset
        times: dict[str, list[float]] = {k: [] for k in libs}
        worst = 0.0
        for i, tok in enumerate(rng.integers(0, 1024, args.n)):
            xs = {}
            for k in (("before", "after") if i % 2 else ("after", "before")):
                s = states[k]
                x = s._input(int(tok), bench.N_PROMPT_TOKENS + i)
                t = time.perf_counter()
                libs[k].decode_layers(ctypes.cast(s._fused, ctypes.c_void_p), len(w.layers), s.keys[0].shape[1],
                                      s.offset, x.ctypes.data, s._scratch.ctypes.data, w.dim, w.num_heads,
                                      s._h.shape[0], float(w.scale), 1e-5, th)
                times[k].append((time.perf_counter() - t) * 1e3)
                s.offset += 1
                xs[k] = x
            worst = max(worst, float(np.abs(xs["before"] - xs["after"]).max()))
        print("decode step, median ms (cache rows): before / after")
        for a in range(0, args.n, 100):
            b, f = np.median(times["before"][a:a + 100]), np.median(times["after"][a:a + 100])
            rows = f"{start + a:4d}-{start + min(a + 100, args.n):4d}"
            print(f"  {rows}   {b:6.2f} / {f:6.2f}   after/before {f / b:.2f}")
        print(f"  largest |state difference| {worst:.3g}")

        T, D, H = states["after"].offset - args.n, w.dim, w.num_heads
        hd, cap = D // H, T + 1
        qkv = rng.standard_normal((T, 3 * D)).astype(np.float32)
        bufs = {k: [np.zeros((H, cap, hd), np.float32), np.zeros((H, cap, hd), np.float32),
                    np.empty((T, D), np.float32), np.empty(H * (hd * T + T), np.float32)] for k in libs}
        pt: dict[str, list[float]] = {k: [] for k in libs}
        for _ in range(args.rounds):
            for k, lib in libs.items():
                K, V, O, S = bufs[k]
                t = time.perf_counter()
                for _layer in w.layers:
                    lib.prefill_attention(qkv.ctypes.data, K.ctypes.data, V.ctypes.data, O.ctypes.data, S.ctypes.data,
                                          T, D, H, cap, bench.N_PROMPT_PHONES + bench.N_TARGET_PHONES, 0.17, th)
                pt[k].append((time.perf_counter() - t) * 1e3)
        b, f = np.median(pt["before"]), np.median(pt["after"])
        print(f"prefill attention, {len(w.layers)} layers, {T} rows, median ms: {b:.1f} / {f:.1f}   "
              f"after/before {f / b:.2f}   outputs equal: {np.array_equal(bufs['before'][2], bufs['after'][2])}")

        layer = w.layers[0]
        products = [(name, getattr(layer, f"{name}_w"), getattr(layer, f"{name}_b"))
                    for name in ("qkv", "out", "fc1", "fc2")]
        for rows in (T, bench.N_BERT_TOKENS):
            xs = {name: rng.standard_normal((rows, m.shape[1])).astype(np.float32) for name, m, _ in products}
            ys = {k: {name: np.empty((rows, m.shape[0]), np.float32) for name, m, _ in products} for k in libs}
            gt: dict[str, list[float]] = {k: [] for k in libs}
            for _ in range(args.rounds):
                for k, lib in libs.items():
                    t = time.perf_counter()
                    for name, m, bias in products:
                        lib.gemm_f16(m.w.ctypes.data, xs[name].ctypes.data, bias.ctypes.data, ys[k][name].ctypes.data,
                                     rows, m.shape[0], m.shape[1], 0, th)
                    gt[k].append((time.perf_counter() - t) * 1e3)
            diff = max(float(np.abs(ys["before"][n] - ys["after"][n]).max()) for n, _, _ in products)
            b, f = np.median(gt["before"]), np.median(gt["after"])
            print(f"gemm_f16, one block's 4 products, {rows} rows, median ms: {b:.2f} / {f:.2f}   "
                  f"after/before {f / b:.2f}   largest |difference| {diff:.2g}")

    kernel = half_gemv.kernel()
    real = t2s_numpy._add_norm
    norms = {"numpy": lambda x, y, ww, bb, fn, eps=1e-5: real(x, y, ww, bb, None, eps), "library": real}
    pf: dict[str, list[float]] = {k: [] for k in norms}
    for _ in range(args.rounds):
        for k, f in norms.items():
            t2s_numpy._add_norm = f
            t = time.perf_counter()
            dec.prefill(phones, feats, prompt, 1)
            pf[k].append((time.perf_counter() - t) * 1e3)
    t2s_numpy._add_norm = real
    b, f = np.median(pf["numpy"]), np.median(pf["library"])
    print(f"prefill (this checkout), residual norms in numpy / in the library, median ms: {b:.1f} / {f:.1f}   "
          f"ratio {f / b:.2f}  (kernels: {kernel is not None})")
    print(f"loadavg after {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
