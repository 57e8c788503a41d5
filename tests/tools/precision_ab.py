"""The exact and the int8 GPT decode step end to end, alternating in one process (PRIMESPEECH_PRECISION).

    PRIMESPEECH_THREADS=1 python tests/tools/precision_ab.py [--rounds 5] [--variant NAME:precision=int8 ...]

Two engines on the bench's real-size random-weight set (``primespeech-mlx bench`` builds it once: 24-layer GPT,
v2 SoVITS, full-size encoders; the bench's 20-character sentence, 100 semantic tokens, 4.3 s of audio, cached
reference, ``top_k`` 15, seed 1), one per variant (default ``exact`` and ``int8``), each synthesising the sentence
whole in turn within every round (after one warm-up each). Prints per variant the min / median end-to-end seconds,
the real-time factor (seconds per second of audio) and the engine's stage timings (median ms), then the ratio of
each variant to the first per round. The machine is shared: read the ratios and the mins, not one run's seconds.
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


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, rest = text.partition(":")
    levers = dict(kv.split("=", 1) for kv in rest.split(",") if kv)
    return name, levers


def main(argv: list[str] | None = None) -> int:
    from dora_primespeech_mlx.bench.measure import bench_runtime
    from dora_primespeech_mlx.bench.weights import TARGET_TEXT, bench_voice, default_models_dir, ensure_models
    from dora_primespeech_mlx.engine import GPTSoVITSEngine

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--variant", action="append", help="NAME:FIELD=VALUE[,FIELD=VALUE] (Runtime fields)")
    ap.add_argument("--text", default=TARGET_TEXT)
    args = ap.parse_args(argv)
    variants = [parse_variant(v) for v in (args.variant or ["exact:precision=exact", "int8:precision=int8"])]
    root = ensure_models(default_models_dir())
    spec = bench_voice(root)
    opts = {"text_split_method": "cut0", "top_k": 15, "seed": 1}
    engines = {}
    for name, levers in variants:
        eng = GPTSoVITSEngine(model_dir=root, runtime=bench_runtime(**levers))
        eng.load_voice(spec)
        eng.synthesize(args.text, voice=spec, **opts)  # warm-up
        engines[name] = eng
        dec = eng.store.models(spec).gpt.decoder
        step = dec.weights().precision if hasattr(dec, "weights") else dec.kind
        print(f"{name}: {levers} (GPT decode step: {step})")
    seconds: dict[str, list[float]] = {n: [] for n in engines}
    rtf: dict[str, list[float]] = {n: [] for n in engines}
    stages: dict[str, dict[str, list[float]]] = {n: {} for n in engines}
    tokens: dict[str, list[int]] = {n: [] for n in engines}
    for r in range(args.rounds):
        order = list(engines.items()) if r % 2 == 0 else list(engines.items())[::-1]
        for name, eng in order:
            t = time.perf_counter()
            res = eng.synthesize(args.text, voice=spec, **opts)
            s = time.perf_counter() - t
            seconds[name].append(s)
            rtf[name].append(s / res.duration)
            tokens[name].append(len(res.semantic_tokens))
            for k, v in res.timings.items():
                stages[name].setdefault(k, []).append(v * 1e3)
    first = next(iter(engines))
    for name in engines:
        st = ", ".join(f"{k} {statistics.median(v):.0f}" for k, v in stages[name].items())
        ratios = [a / b for a, b in zip(seconds[name], seconds[first])]
        print(f"{name:<8} e2e {min(seconds[name]):.3f} / {statistics.median(seconds[name]):.3f} s, RTF "
              f"{min(rtf[name]):.3f} / {statistics.median(rtf[name]):.3f}, tokens {sorted(set(tokens[name]))}; "
              f"/{first} per round {' '.join(f'{x:.2f}' for x in ratios)} (median {statistics.median(ratios):.2f})")
        print(f"         stages ms (median): {st}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
