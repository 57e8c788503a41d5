"""Where one SoVITS decode's time goes, stage by stage, on the bench's real-size set (1 thread unless told).

    PRIMESPEECH_THREADS=1 python tests/tools/sovits_stages.py [--rounds 5]

The bench's v2 SoVITS (``primespeech-mlx bench`` builds the set once) decodes 100 random semantic tokens (4.3 s of
audio) with the vocoder the engine picks here (ONNX Runtime on the CPU), split into its stages, each evaluated
before the next starts: text encoder (``encode_features``: the semantic tokens and the target phones against the
reference embedding), prior (``project`` + ``sample_prior``), flow (``flow_reverse``), vocoder (``vocode``).
Prints min / median ms per stage and per second of audio, with numpy's float32 sgemm rate measured in the same run
(one 512 x 2048 x 2048 product) for the FLOP-rate comparison.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO)]  # this checkout's package

from dora_primespeech_mlx import _blas  # noqa: E402  (the BLAS before MLX)

_blas.preload()

import numpy as np  # noqa: E402


def sgemm_gflops(repeat: int = 5) -> float:
    rng = np.random.default_rng(0)
    a = rng.random((512, 2048), dtype=np.float32)
    b = rng.random((2048, 2048), dtype=np.float32)
    best = min(_time(lambda: a @ b) for _ in range(repeat))
    return 2 * 512 * 2048 * 2048 / best / 1e9


def _time(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    import mlx.core as mx

    from dora_primespeech_mlx.bench.measure import bench_runtime
    from dora_primespeech_mlx.bench.weights import N_TARGET_PHONES, N_TOKENS, default_models_dir, ensure_models
    from dora_primespeech_mlx.convert import load
    from dora_primespeech_mlx.models import audio
    from dora_primespeech_mlx.models.sovits import vocoder

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    root = ensure_models(default_models_dir())
    runtime = bench_runtime()
    sovits = load.load_sovits(root / "sovits", runtime=runtime)
    sovits.use_vocoder(vocoder.from_runtime(sovits, runtime.replace(release_mlx=False), root / "sovits"))
    rng = np.random.default_rng(0)
    wav32k, _ = audio.load_wav(root / "reference.wav")
    spec = audio.spectrogram(wav32k, sovits.args.filter_length, sovits.args.hop_length, sovits.args.win_length)
    ge = sovits.ref_embedding(mx.array(spec))
    mx.eval(ge)
    codes = mx.array(rng.integers(0, 1024, (1, 1, N_TOKENS)).astype(np.int32))
    phones = mx.array(rng.integers(0, sovits.args.n_symbols, (1, N_TARGET_PHONES)).astype(np.int32))
    times: dict[str, list[float]] = {k: [] for k in ("text encoder", "prior", "flow", "vocoder", "whole")}
    seconds = 0.0
    for r in range(args.rounds + 1):
        t0 = time.perf_counter()
        y = sovits.encode_features(codes, phones, ge)
        mx.eval(y)
        t1 = time.perf_counter()
        _x, m_p, logs_p, y_mask = sovits.project(y, 1.0)
        z_p = sovits.sample_prior(m_p, logs_p, 0.5, seed=0)
        mx.eval(z_p, y_mask)
        t2 = time.perf_counter()
        z = sovits.flow_reverse(z_p, y_mask, ge)
        mx.eval(z)
        t3 = time.perf_counter()
        wave = sovits.vocode(z, ge, y_mask)
        mx.eval(wave)
        t4 = time.perf_counter()
        if r == 0:
            seconds = wave.shape[-1] / sovits.sampling_rate
            continue  # warm-up
        for k, v in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0)):
            times[k].append(v * 1e3)
    print(f"SoVITS decode of {N_TOKENS} tokens ({seconds:.2f} s of audio), vocoder "
          f"{sovits.vocoder_backend.active}, {args.rounds} rounds; numpy sgemm {sgemm_gflops():.0f} GFLOP/s")
    for k, v in times.items():
        print(f"  {k:<13} {min(v):8.1f} / {statistics.median(v):8.1f} ms   {min(v) / 1e3 / seconds:.3f} s per s audio")
    return 0


if __name__ == "__main__":
    sys.exit(main())
