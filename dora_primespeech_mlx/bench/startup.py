"""Start-up stages of a fresh process, in the order a node starts: the imports, each text front end the voice's
language reaches (:func:`~..text.warmup.warm_up`), the voice (the bench's real-size random-weight models), the
warm-up synthesis; then when it is ready and when the first chunk of its first text (streamed) comes out, both
counted from the process's start; once with nothing queued, once with a text sent at the start (the warm-up's
synthesis then gives way to it, as in the node). ``primespeech-mlx bench`` runs :func:`startup` and prints the
stages (``--no-startup`` skips it, ``--startup`` runs only it; ``--startup --cotenant SPEC``: idle, then beside
each co-tenant, :func:`startup_loads`); on their own: ``python -m dora_primespeech_mlx.bench.startup [MODELS_DIR]
[--cotenant SPEC ...]``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .measure import _preload_blas, bench_runtime
from .weights import bench_voice, default_models_dir, ensure_models


def first_text(language: str) -> str:
    """The first text a start speaks (the warm-up's: a few words in the voice's language)."""
    return "你好。" if language in ("zh", "all_zh") else "Hello."


def startup_probe(root: Path, started: float, spec=None, text_at_start: bool = False) -> dict[str, Any]:
    """The stages in this process (run fresh by :func:`startup`), seconds each, in the node's order
    (``engine.startup.start_engine``): the imports, each text front end, the voice, the warm-up; then ``ready_s``
    (from ``started``, ``time.perf_counter()`` before the process imported anything of the package) and
    ``first_audio_s``, when the first streamed chunk of :func:`first_text` came out, also from ``started``.
    ``text_at_start``: the text was sent at the start (the node's queued text: the warm-up's synthesis gives way to
    it). ``reference``: whether the voice's reference features were ``computed`` or read from the ``cache``.
    ``spec``: the voice (default: the bench's models in ``root``)."""
    import threading

    from ..engine import GPTSoVITSEngine  # (here: `primespeech-mlx` builds its parser without loading MLX)
    from ..text.warmup import warm_up

    out: dict[str, Any] = {"imports_s": round(time.perf_counter() - started, 2), "text_at_start": text_at_start}
    engine = GPTSoVITSEngine(model_dir=root, runtime=bench_runtime())
    spec = spec if spec is not None else bench_voice(root)
    out["front_ends_s"] = {lang: round(s, 2) for lang, s in warm_up(spec.language, data=engine.text_data).items()}
    t = time.perf_counter()
    engine.load_voice(spec)
    out["voice_s"] = round(time.perf_counter() - t, 2)
    out["reference"] = "computed" if engine.stats()["reference_computations"] else "cache"
    waiting = threading.Event()
    if text_at_start:
        waiting.set()
    t = time.perf_counter()
    engine.warmup(cancel=waiting)
    out["warmup_s"] = round(time.perf_counter() - t, 2)
    out["ready_s"] = out["total_s"] = round(time.perf_counter() - started, 2)
    for _chunk in engine.synthesize_stream(first_text(spec.language)):
        out["first_audio_s"] = round(time.perf_counter() - started, 2)
        break
    return out


def startup(root: Path, text_at_start: bool | None = None, voice: str | None = None) -> dict[str, Any]:
    """:func:`startup_probe` in a fresh process (nothing loaded or cached in memory before it); ``text_at_start``
    None: both starts, each in its own process (nothing queued, then a text sent at the start), as
    ``{"idle": ..., "text_at_start": ...}``. ``voice``: a voice's name resolved in ``root`` (default: the bench's
    models)."""
    if text_at_start is None:
        return {"idle": startup(root, False, voice), "text_at_start": startup(root, True, voice)}
    code = ("import time; started = time.perf_counter(); import sys, json, pathlib; "
            "from dora_primespeech_mlx.bench.measure import _preload_blas; _preload_blas(); "
            "from dora_primespeech_mlx.bench.startup import startup_probe; "
            "from dora_primespeech_mlx.assets.catalog import resolve_voice; root = pathlib.Path(sys.argv[1]); "
            "spec = resolve_voice(sys.argv[3], root) if sys.argv[3] else None; "
            "print(json.dumps(startup_probe(root, started, spec, text_at_start=sys.argv[2] == '1')))")
    done = subprocess.run([sys.executable, "-c", code, str(root), str(int(text_at_start)), voice or ""], check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def startup_loads(root: Path, cotenants=(), voice: str | None = None) -> dict[str, Any]:
    """:func:`startup`'s pair idle, then beside each co-tenant (a :class:`.cotenant.CotenantSpec`, running from
    before the first start's process begins to the end of the second: ``bench --conversation``'s co-tenants), in one
    run: ``{"loads": {"idle": pair, SPEC: pair + {"cotenant": its figures}}}``; a co-tenant that does not start or
    ends without figures gives ``{"error": why}`` in its place."""
    from .cotenant import started

    loads: dict[str, Any] = {"idle": startup(root, voice=voice)}
    for spec in cotenants:
        running, problem = started(spec)
        if problem:
            loads[spec.text] = {"error": problem}
            continue
        try:
            pair = startup(root, voice=voice)
        finally:
            try:
                figures = running.stop()
            except RuntimeError as exc:
                figures = {"error": str(exc)}
        loads[spec.text] = {**pair, "cotenant": figures}
    return {"loads": loads}


def describe(stages: dict[str, Any]) -> str:
    """One line per start: ``start-up (fresh process, nothing queued): imports 0.2 s, zh front end 1.2 s, ...,
    voice 1.3 s (reference features from the cache), warm-up 3.2 s; ready 7.4 s, first audio 8.9 s after the
    start``; :func:`startup`'s pair gives two lines."""
    if "loads" in stages:  # startup_loads: a heading per load, then its pair
        lines = []
        for load, pair in stages["loads"].items():
            fig = pair.get("cotenant", {}) if isinstance(pair, dict) else {}
            tps = f", {fig['tokens_per_s']:.1f} tokens/s" if "tokens_per_s" in fig else ""
            lines.append("idle:" if load == "idle" else f"beside the co-tenant {load}{tps}:")
            if "error" in fig:
                lines.append(f"  (the co-tenant: {fig['error']})")
            lines += ["  " + line for line in describe(pair).splitlines()]
        return "\n".join(lines)
    if "error" in stages:
        return f"start-up (fresh process): {stages['error']}"
    if "idle" in stages:
        return "\n".join(describe(stages[k]) for k in ("idle", "text_at_start"))
    fronts = ", ".join(f"{lang} front end {s:.1f} s" for lang, s in stages["front_ends_s"].items())
    how = "a text sent at the start" if stages.get("text_at_start") else "nothing queued"
    ref = {"cache": " (reference features from the cache)", "computed": " (reference features computed)"}
    line = (f"start-up (fresh process, {how}): imports {stages['imports_s']:.1f} s, {fronts}, "
            f"voice {stages['voice_s']:.1f} s{ref.get(stages.get('reference'), '')}, "
            f"warm-up {stages['warmup_s']:.1f} s; ready {stages['ready_s']:.1f} s")
    if "first_audio_s" in stages:
        line += f", first audio {stages['first_audio_s']:.1f} s after the start"
    return line


def main(argv: list[str] | None = None) -> int:
    import argparse

    from .cotenant import parse

    p = argparse.ArgumentParser(prog="python -m dora_primespeech_mlx.bench.startup",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("models_dir", nargs="?", help="the bench's random-weight models (default: the user cache)")
    p.add_argument("--cotenant", action="append", metavar="SPEC", default=[],
                   help="also start beside this co-tenant (repeatable; bench/cotenant.py)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        cotenants = [parse(spec) for spec in args.cotenant]
    except ValueError as exc:
        p.error(str(exc))
    root = Path(args.models_dir).expanduser() if args.models_dir else default_models_dir()
    _preload_blas()
    ensure_models(root)
    print(describe(startup_loads(root, cotenants) if cotenants else startup(root)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
