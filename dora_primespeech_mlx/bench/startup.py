"""Start-up stages of a fresh process, in the order a node starts: the imports, each text front end the voice's
language reaches (:func:`~..text.warmup.warm_up`), the voice (the bench's real-size random-weight models), the
warm-up synthesis. ``primespeech-mlx bench`` runs :func:`startup` and prints the stages (``--no-startup`` skips
it); on their own: ``python -m dora_primespeech_mlx.bench.startup [MODELS_DIR]``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .measure import _preload_blas, bench_runtime
from .weights import bench_voice, default_models_dir, ensure_models


def startup_probe(root: Path, started: float, spec=None) -> dict[str, Any]:
    """The stages in this process (run fresh by :func:`startup`), seconds each; ``started``: ``time.perf_counter()``
    before the process imported anything of the package (the imports stage runs from there); ``spec``: the voice
    (default: the bench's models in ``root``)."""
    from ..engine import GPTSoVITSEngine  # (here: `primespeech-mlx` builds its parser without loading MLX)
    from ..text.warmup import warm_up

    out: dict[str, Any] = {"imports_s": round(time.perf_counter() - started, 2)}
    engine = GPTSoVITSEngine(model_dir=root, runtime=bench_runtime())
    spec = spec if spec is not None else bench_voice(root)
    out["front_ends_s"] = {lang: round(s, 2) for lang, s in warm_up(spec.language, data=engine.text_data).items()}
    t = time.perf_counter()
    engine.load_voice(spec)
    out["voice_s"] = round(time.perf_counter() - t, 2)
    t = time.perf_counter()
    engine.warmup()
    out["warmup_s"] = round(time.perf_counter() - t, 2)
    out["total_s"] = round(time.perf_counter() - started, 2)
    return out


def startup(root: Path) -> dict[str, Any]:
    """:func:`startup_probe` in a fresh process (nothing loaded or cached in memory before it)."""
    code = ("import time; started = time.perf_counter(); import sys, json, pathlib; "
            "from dora_primespeech_mlx.bench.measure import _preload_blas; _preload_blas(); "
            "from dora_primespeech_mlx.bench.startup import startup_probe; "
            "print(json.dumps(startup_probe(pathlib.Path(sys.argv[1]), started)))")
    done = subprocess.run([sys.executable, "-c", code, str(root)], check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def describe(stages: dict[str, Any]) -> str:
    """One line: ``start-up (fresh process): imports 0.9 s, zh 1.2 s, en 1.0 s, voice 3.0 s, warm-up 0.4 s ...``."""
    if "error" in stages:
        return f"start-up (fresh process): {stages['error']}"
    fronts = ", ".join(f"{lang} front end {s:.1f} s" for lang, s in stages["front_ends_s"].items())
    return (f"start-up (fresh process): imports {stages['imports_s']:.1f} s, {fronts}, "
            f"voice {stages['voice_s']:.1f} s, warm-up {stages['warmup_s']:.1f} s; total {stages['total_s']:.1f} s")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    root = Path(argv[0]).expanduser() if argv else default_models_dir()
    _preload_blas()
    ensure_models(root)
    print(describe(startup(root)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
