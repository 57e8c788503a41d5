"""``primespeech-mlx bench --compare PYTHON``: this package next to the original GPT-SoVITS and two CPU peers.

Runs the side-by-side runners of the project's compare tools (``shared/tools/compare``: ``sidebyside.py``
for the original PyTorch pipeline and for this package, ``peers/genie/run_genie.py``,
``peers/cpufast/run_cpufast.py``; their README sets them up) one process at a time, alternating the sides
within each round and thread count, on the same real-size random-weight set (``$REF_BIG``), and prints
each side's medians with this package's ratios to every other side, measured in the same run. The 1-minute
load average is recorded before each side. Sides that are not set up are reported as such, not guessed.

``PYTHON`` is the interpreter of the original's venv (torch CPU + the GPT-SoVITS checkout in ``$GSV_ROOT``);
"ours" runs with this interpreter and this copy of the package. Not a test: compare ratios, not times.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..settings import VARS, child_env, process_setting

SIDES = ("upstream", "ours", "genie", "cpufast")
ISAS = ("avx512", "avx2", "generic", "none")  # ``ours:ISA`` forces a kernel build (PRIMESPEECH_ISA) for that side
SETTINGS = {v.field: v for v in VARS}  # ``ours:FIELD=VALUE[+...]`` sets those settings for that side
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the checkout (or site-packages) holding dora_primespeech_mlx


def cache_dir() -> Path:
    """The compare tools' scratch folder (their README's ``$XDG_CACHE_HOME/primespeech-ref``)."""
    return Path(process_setting("cache_dir")).parent / "primespeech-ref"


def find_tools(given: str | None) -> Path | None:
    """The compare tools folder: --compare-tools, or shared/tools/compare beside the checkout."""
    candidates = [given, PACKAGE_ROOT.parent / "shared" / "tools" / "compare",
                  Path.cwd().parent / "shared" / "tools" / "compare"]
    for c in candidates:
        if c and (Path(c) / "sidebyside.py").is_file():
            return Path(c).resolve()
    return None


def side_commands(args, tools: Path) -> dict[str, list[str] | str]:
    """side -> argv, or the reason it cannot run."""
    cache = cache_dir()
    pythons = {"upstream": args.compare, "ours": sys.executable,
               "genie": args.genie_python or str(cache / "genie-venv/bin/python"),
               "cpufast": args.cpufast_python or str(cache / "cpufast-venv/bin/python")}
    scripts = {"upstream": [str(tools / "sidebyside.py"), "upstream"], "ours": [str(tools / "sidebyside.py"), "ours"],
               "genie": [str(tools / "peers/genie/run_genie.py")],
               "cpufast": [str(tools / "peers/cpufast/run_cpufast.py")]}
    out: dict[str, list[str] | str] = {}
    for side in args.sides.split(","):
        side = side.strip()
        base = side.partition(":")[0]
        if base not in SIDES or (":" in side and (base != "ours" or variant_env(side) is None)):
            raise SystemExit(f"error: unknown side {side!r} (use {','.join(SIDES)}, ours:ISA with ISA one of "
                             f"{', '.join(ISAS)}, or ours:SETTING=VALUE[+SETTING=VALUE] with settings named as in "
                             "the Settings fields, e.g. ours:vocoder_parts=4)")
        py, script = pythons[base], scripts[base]
        if not Path(py).is_file():
            out[side] = f"not set up: no interpreter {py}"
        elif not Path(script[0]).is_file():
            out[side] = f"not set up: no runner {script[0]}"
        else:
            extra = ["--runs", str(args.runs), "--split", args.split] + (["--text", args.text] if args.text else [])
            out[side] = [py, *script, *extra]
    return out


def run_side(argv: list[str], threads: int, env: dict[str, str], timeout: float) -> dict[str, Any]:
    """One side in its own process; its ``SBS {json}`` line, or {"error": ...}. The side's temporary files (the
    runners convert a model set per run, ~2 GB) go to a folder removed when it ends (TMPDIR)."""
    with tempfile.TemporaryDirectory(prefix="primespeech-compare-") as tmp:
        try:
            p = subprocess.run([*argv, "--threads", str(threads)], env={**env, "TMPDIR": tmp}, cwd=tmp,
                               capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s"}
    for line in p.stdout.splitlines():
        if line.startswith("SBS "):
            return json.loads(line[4:])
    tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or [f"exit {p.returncode}"]
    return {"error": f"exit {p.returncode}: {tail[0][:200]}"}


def kernel_build(python: str, env: dict[str, str]) -> str:
    """Which float16 kernel build an ``ours`` side's process takes, and why (its own interpreter and env)."""
    code = ("from dora_primespeech_mlx.models.kernels import half_gemv as h; s = h.library_status(); "
            "print(f\"{s['isa']} ({s['isa_reason']})\")")
    try:
        p = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({exc})"
    return p.stdout.strip() or f"unknown (exit {p.returncode}: {(p.stderr.strip().splitlines() or [''])[-1][:200]})"


def cpu_name() -> str:
    """This machine's CPU model and whether it has AVX-512 (the kernels' fastest build)."""
    from ..models.kernels.half_gemv import cpu_flags

    flags = cpu_flags()  # a list, or why there is none
    isa = flags if isinstance(flags, str) else \
        "AVX-512" if "avx512f" in flags else "AVX2, no AVX-512" if "avx2" in flags else "no AVX2"
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{model} ({isa}, {os.cpu_count()} CPUs)"


def variant_env(side: str) -> dict[str, str] | None:
    """The environment an ``ours:...`` side adds: ``ours:ISA`` forces that kernel build (``PRIMESPEECH_ISA``),
    ``ours:vocoder_parts=4+overlap=0`` sets those settings (their primary environment names); None: not a variant."""
    variant = side.partition(":")[2]
    if not variant:
        return {} if ":" not in side else None
    if variant in ISAS:
        return {"PRIMESPEECH_ISA": variant}
    out = {}
    for item in variant.split("+"):
        field, eq, value = item.partition("=")
        if not eq or field not in SETTINGS:
            return None
        try:
            SETTINGS[field].parse(value)
        except ValueError:
            return None
        out[SETTINGS[field].name] = value
    return out


def side_env(env: dict[str, str], side: str) -> dict[str, str]:
    """A side's environment: ``env`` with its variant's settings (:func:`variant_env`)."""
    return {**env, **(variant_env(side) or {})}


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(results: dict[int, dict[str, list[dict]]]) -> dict[int, dict[str, dict[str, Any]]]:
    """Per thread count and side: medians over every timed run of every round, and ours / side per round."""
    out: dict[int, dict[str, dict[str, Any]]] = {}
    for threads, by_side in results.items():
        out[threads] = {}
        ours_rounds = [r for r in by_side.get("ours", []) if "error" not in r]
        for side, rounds in by_side.items():
            ok = [r for r in rounds if "error" not in r]
            s: dict[str, Any] = {"rounds": len(ok), "errors": [r["error"] for r in rounds if "error" in r],
                                 "loadavg": [r.get("loadavg_before") for r in rounds]}
            if ok:
                s["e2e"] = _median([t for r in ok for t in r["e2e_cached_s"]])
                s["ttfa"] = _median([t for r in ok for t in r.get("ttfa_s") or []])
                s["tokens"] = ok[0].get("tokens")
                s["audio_s"] = ok[0].get("audio_s")
                s.update(stage_seconds(side, ok))
                pairs = [(o, r) for o, r in zip(ours_rounds, ok)] if side != "ours" else []
                s["e2e_ratio_rounds"] = [o["e2e_cached_s_median"] / r["e2e_cached_s_median"] for o, r in pairs]
                s["ttfa_ratio_rounds"] = [o["ttfa_s_median"] / r["ttfa_s_median"] for o, r in pairs
                                          if r.get("ttfa_s_median")]
            out[threads][side] = s
        ours = out[threads].get("ours", {})
        for side, s in out[threads].items():
            if side != "ours" and ours.get("e2e") and s.get("e2e"):
                s["e2e_ratio"] = ours["e2e"] / s["e2e"]
                if ours.get("ttfa") and s.get("ttfa"):
                    s["ttfa_ratio"] = ours["ttfa"] / s["ttfa"]
    return out


def stage_seconds(side: str, rounds: list[dict]) -> dict[str, float]:
    """SoVITS seconds and GPT seconds per token (prefill included) per synthesis, where the runner reports
    stages (ours: the engine's mean timings — SoVITS of whole requests, a stream's windows are timed apart as
    ``sovits_stream``; GPT over whole and streamed requests; genie: t2s and vocoder+rest;
    cpufast: TTS.run's t2s / vits). The original's runner reports none."""
    keys = {"ours": ("sovits", ("gpt_prefill", "gpt_decode")), "genie": ("vits_and_rest", ("t2s",)),
            "cpufast": ("vits", ("t2s",))}.get(side.partition(":")[0])
    out: dict[str, float] = {}
    if not keys:
        return out
    tims = [r.get("timings") or {} for r in rounds]
    sov = [t[keys[0]] for t in tims if keys[0] in t]
    gpt = [sum(t[k] for k in keys[1]) / max(1, r.get("tokens") or 1) for t, r in zip(tims, rounds)
           if all(k in t for k in keys[1])]
    if sov:
        out["sovits_s"] = statistics.median(sov)
    if gpt:
        out["gpt_ms_per_token"] = 1e3 * statistics.median(gpt)
    return out


def _f(value, fmt: str = "{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def table(summary: dict[int, dict[str, dict[str, Any]]], not_run: dict[str, str]) -> str:
    lines = [f"{'threads':<8}{'side':<12}{'e2e s':>8}{'ours/side':>11}{'per round':>16}{'first audio s':>15}"
             f"{'ours/side':>11}{'SoVITS s':>10}{'GPT ms/tok':>12}{'tokens':>8}  loadavg before / errors"]
    for threads, sides in sorted(summary.items()):
        for side, s in sides.items():
            per = s.get("e2e_ratio_rounds") or []
            rng = f"{min(per):.2f}-{max(per):.2f}" if per else "-"
            lines.append(
                f"{threads:<8}{side:<12}{_f(s.get('e2e')):>8}{_f(s.get('e2e_ratio'), '{:.2f}x'):>11}{rng:>16}"
                f"{_f(s.get('ttfa')):>15}{_f(s.get('ttfa_ratio'), '{:.2f}x'):>11}{_f(s.get('sovits_s')):>10}"
                f"{_f(s.get('gpt_ms_per_token'), '{:.1f}'):>12}{_f(s.get('tokens'), '{}'):>8}  "
                f"{' '.join(_f(x) for x in s['loadavg'])}{' ' + '; '.join(s['errors']) if s['errors'] else ''}")
    for side, why in not_run.items():
        lines.append(f"{side}: {why}")
    lines.append("e2e = non-streaming, cached reference; first audio = streaming first chunk (upstream, ours, "
                 "cpufast: 16-token chunks / the engine's windows; genie does not stream: first segment); "
                 "ratios < 1 = ours faster. GPT ms/tok includes the prefill; ours' stage timings are the "
                 "engine's means (SoVITS: whole requests; GPT: whole and streamed).")
    return "\n".join(lines)


def run_compare(args) -> int:
    tools = find_tools(args.compare_tools)
    if tools is None:
        print("error: compare tools not found (shared/tools/compare with sidebyside.py); give --compare-tools DIR",
              file=sys.stderr)
        return 2
    env = child_env()  # the tools read GSV_ROOT and REF_BIG themselves (their README): --gsv-root / --ref-big set them
    env["GSV_ROOT"] = str(args.gsv_root or env.get("GSV_ROOT") or cache_dir() / "gsv")
    env["REF_BIG"] = str(args.ref_big or env.get("REF_BIG") or cache_dir() / "ref-big")
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    if not (Path(env["REF_BIG"]) / "gpt" / "s1-v2-random.ckpt").is_file():
        print(f"error: the real-size set is missing in {env['REF_BIG']}: run {tools / 'make_big.py'} with the "
              f"original's python (see {tools / 'README.md'})", file=sys.stderr)
        return 2
    commands = side_commands(args, tools)
    not_run = {s: c for s, c in commands.items() if isinstance(c, str)}
    runnable = {s: c for s, c in commands.items() if not isinstance(c, str)}
    if "ours" not in runnable or len(runnable) < 2:
        print("error: nothing to compare against: " + "; ".join(f"{s} {w}" for s, w in not_run.items()),
              file=sys.stderr)
        return 2
    threads = [int(t) for t in args.threads.split(",")]
    results: dict[int, dict[str, list[dict]]] = {t: {s: [] for s in runnable} for t in threads}
    for rnd in range(args.rounds):
        for t in threads:
            for side, argv in runnable.items():
                load = os.getloadavg()[0]
                res = run_side(argv, t, side_env(env, side), args.side_timeout)
                res["loadavg_before"] = load
                results[t][side].append(res)
                what = res["error"] if "error" in res else f"e2e {res['e2e_cached_s_median']:.2f} s"
                print(f"round {rnd + 1} threads {t} {side}: load {load:.2f} {what}", file=sys.stderr, flush=True)
    summary = summarize(results)
    builds = {side: kernel_build(argv[0], side_env(env, side)) for side, argv in runnable.items()
              if side.startswith("ours")}
    if args.json:
        print(json.dumps({"cpu": cpu_name(), "kernels": builds, "summary": summary, "not_run": not_run,
                          "raw": results}, default=str, ensure_ascii=False))
    else:
        print(f"CPU: {cpu_name()}")
        print("\n".join(f"{side} kernels: {build}" for side, build in builds.items()))
        print(table(summary, not_run))
    return 0


def add_arguments(p) -> None:
    g = p.add_argument_group("side by side (--compare)")
    g.add_argument("--compare", metavar="PYTHON", help="run side by side with the original GPT-SoVITS (this is its "
                   "venv's python) and the peers, and print ratios from one run")
    g.add_argument("--compare-tools", metavar="DIR", help="the compare tools folder (default: shared/tools/compare "
                   "beside the checkout)")
    g.add_argument("--gsv-root", metavar="DIR", help="the original GPT-SoVITS checkout (default: $GSV_ROOT as the "
                   "tools read it, else ~/.cache/primespeech-ref/gsv)")
    g.add_argument("--ref-big", metavar="DIR", help="the real-size random-weight set (default: $REF_BIG as the tools "
                   "read it, else ~/.cache/primespeech-ref/ref-big)")
    g.add_argument("--sides", default=",".join(SIDES), help="comma list (default: all four); ours:ISA runs this "
                   "package again with a forced kernel build (e.g. ours:avx2 on an AVX-512 machine), "
                   "ours:SETTING=VALUE[+...] with those settings (e.g. ours:vocoder_parts=4)")
    g.add_argument("--threads", default="1,2", help="thread counts, --compare and --timeline (default 1,2)")
    g.add_argument("--rounds", type=int, default=1, help="alternating rounds (default 1)")
    g.add_argument("--runs", type=int, default=3, help="timed runs per side and round (default 3)")
    g.add_argument("--text", help="text to speak, --compare and --timeline (default: the one sentence)")
    g.add_argument("--split", default="cut0", help="text_split_method, --compare and --timeline (default cut0)")
    g.add_argument("--genie-python", help="Genie-TTS venv python (default ~/.cache/primespeech-ref/genie-venv)")
    g.add_argument("--cpufast-python", help="gpt-sovits-cpufast venv python (default .../cpufast-venv)")
    g.add_argument("--side-timeout", type=float, default=1800.0,
                   help="seconds per side (or --timeline) process (default 1800)")
