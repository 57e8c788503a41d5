"""``primespeech-mlx bench``: how fast is this machine, stage by stage, with real-size v2 models.

The four models are built with **random weights** and the exact real v2 configurations, so no download is needed
and every step costs what it costs with the real files (random weights change no shape); they are cached as
converted MLX folders and loaded through the engine's loader. Each stage runs once to warm up, then ``--repeat``
times; min and median are reported with the 1-minute load average, and the decode step's memory-bandwidth floor
(bytes read per token / the measured read bandwidth) from the same run. Not a test.

Modules: :mod:`.weights` (the models and inputs), :mod:`.stages` (stage and end-to-end timings),
:mod:`.memory` (RSS probes), :mod:`.measure` (helpers), :mod:`.report` (the table), :mod:`.compare`
(``--compare``: the original and the peers side by side), :mod:`.conv` (the vocoder convolution bench),
:mod:`.timeline` (``--timeline``: where each core's time goes during one request)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from .measure import _preload_blas, bench_runtime, loadavg, peak_rss_mb
from .memory import memory_engine, memory_lean, memory_levers
from .report import environment, table
from .stages import bench_engine, bench_stages
from .startup import describe as describe_startup
from .startup import startup, startup_loads
from .weights import default_models_dir, ensure_models


def run(args) -> int:
    if args.compare:  # side by side with the original and the peers, each in its own process
        from .compare import run_compare

        return run_compare(args)
    if args.conversation:  # an LLM stand-in's answer spoken as it is written, each side in its own process
        from .conversation import run_conversation
        from .conversation_dora import run_dora_side

        return run_conversation(args, dora_side=run_dora_side)
    if args.timeline:  # per-thread CPU through one request, in a fresh process per thread count
        from .timeline import run_timeline

        return run_timeline(args)
    _preload_blas()
    root = Path(args.models_dir).expanduser() if args.models_dir else default_models_dir()
    if args.memory_levers:
        ensure_models(root)
        print(memory_levers(root))
        return 0
    if args.startup:  # (--cotenant: idle, then beside each co-tenant, in one run)
        from .cotenant import parse

        try:
            cotenants = [parse(spec) for spec in (args.cotenant or [])]
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        ensure_models(root)
        stages = startup_loads(root, cotenants) if cotenants else startup(root)
        print(json.dumps(stages, indent=2) if args.json else describe_startup(stages))
        return 0
    stages = {s.strip() for s in args.stages.split(",") if s.strip()}
    unknown = stages - {"hubert", "bert", "gpt", "sovits", "e2e"}
    if unknown:
        print(f"error: unknown bench stages {sorted(unknown)} (use hubert,bert,gpt,sovits,e2e)", file=sys.stderr)
        return 2
    if args.device != "auto":
        import mlx.core as mx

        mx.set_default_device(mx.cpu if args.device == "cpu" else mx.gpu)
    ensure_models(root)
    report: dict[str, Any] = {"repeat": args.repeat, "loadavg_start": loadavg()}
    report["environment"] = environment()
    runtime = bench_runtime()
    report["runtime"] = runtime.describe()
    report["stages"], report["memory"] = bench_stages(root, args.repeat, stages, runtime)
    from ..engine.store import release_memory

    release_memory()  # the stage models are gone (MLX cache and heap handed back); the engine loads its own
    if "e2e" in stages:
        try:
            report["engine"] = bench_engine(root, args.repeat, stream=not args.no_stream, runtime=runtime)
        except Exception as exc:  # the bench still reports the stages
            report["engine"] = {"error": f"{type(exc).__name__}: {exc}"}
    report["memory"]["peak_rss_mb"] = peak_rss_mb()
    if not args.no_startup:
        try:
            report["startup"] = startup(root)
        except (subprocess.SubprocessError, ValueError) as exc:
            report["startup"] = {"error": str(exc)}
    if not args.no_memory_probe:
        try:
            report["memory"]["engine_fresh_process"] = memory_engine(root)
        except (subprocess.SubprocessError, ValueError) as exc:
            report["memory"]["engine_fresh_process"] = {"error": str(exc)}
        for half in (False, True):
            try:
                report["memory"][f"lean_load_bert_half_{int(half)}"] = memory_lean(root, half)
            except (subprocess.SubprocessError, ValueError) as exc:
                report["memory"][f"lean_load_bert_half_{int(half)}"] = {"error": str(exc)}
    report["loadavg_end"] = loadavg()
    if args.json:
        print(json.dumps(report, indent=2, ensure_ascii=False, default=str))
    else:
        print(table(report))
        if "startup" in report:
            print(describe_startup(report["startup"]))
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark every stage with real-size random-weight models (no download)",
        description="How fast this machine is, stage by stage, with real-size v2 models built with random "
        "weights (no download); --compare runs the original GPT-SoVITS and the peers side by side.",
    )
    p.add_argument("-n", "--repeat", type=int, default=5, help="timed runs per stage after one warm-up (default 5)")
    p.add_argument("--json", action="store_true", help="print the full report as JSON")
    p.add_argument("--stages", default="hubert,bert,gpt,sovits,e2e", help="comma list (default: all)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "gpu"], help="MLX device (default auto)")
    p.add_argument("--no-stream", action="store_true", help="skip the streaming time-to-first-audio run")
    p.add_argument("--no-memory-probe", action="store_true", help="skip the lean-loading RSS probes")
    p.add_argument("--no-startup", action="store_true",
                   help="skip the start-up stages of a fresh process (imports, each front end, voice, warm-up, ready, "
                   "first audio)")
    p.add_argument("--startup", action="store_true",
                   help="only the start-up stages of a fresh process, nothing queued and a text sent at the start: "
                   "imports, each front end, voice, warm-up, ready, the first text's first audio")
    p.add_argument("--memory-levers", action="store_true",
                   help="only the engine's RSS with each vocoder memory lever on/off (fresh process each)")
    p.add_argument("--timeline", action="store_true",
                   help="per-thread CPU through one whole and one streamed request at each --threads count, with "
                   "the stages running at each moment (Linux)")
    p.add_argument("--models-dir", help="where the random-weight models are written (default: user cache)")
    from .compare import add_arguments
    from .conversation import add_arguments as add_conversation_arguments

    add_arguments(p)
    add_conversation_arguments(p)
    p.set_defaults(func=run)
