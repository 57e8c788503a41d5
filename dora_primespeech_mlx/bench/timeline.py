"""``primespeech-mlx bench --timeline``: where every thread's (and so every core's) time goes during one request.

For each thread count a fresh process (``PRIMESPEECH_THREADS``) loads the bench's real-size models, warms up,
then runs one whole and one streamed synthesis of the text while a sampler thread reads every thread's CPU
nanoseconds (``/proc/self/task/*/schedstat``) and the machine's busy and stolen time (``/proc/stat``) every
:data:`SAMPLE_S`; the engine's stages (text, bert, gpt steps, sovits, ...) report their intervals and threads
(:func:`..engine.stats.recording_spans`). The report gives, per set of stages running at once, the wall time
and how many cores the process kept busy (the second core idles where that stays near 1), per thread its
core-seconds, and a coarse timeline. The sampler's own thread is left out of every figure. Linux only (it
reads ``/proc``). Not a test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from typing import Any

SAMPLE_S = 0.01  # sampling period
BUCKET_S = 0.1  # timeline rows
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _thread_ns() -> dict[int, int]:
    out = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that just ended
    return out


def _machine_s() -> tuple[float, float]:
    """Seconds of (busy, stolen) time summed over every CPU since boot."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal ...
    busy = v[0] + v[1] + v[2] + v[5] + v[6]
    steal = v[7] if len(v) > 7 else 0
    return busy / _CLK_TCK, steal / _CLK_TCK


class Sampler(threading.Thread):
    """Every :data:`SAMPLE_S`: (time, {thread id: CPU ns}, machine busy s, machine stolen s)."""

    def __init__(self, period: float = SAMPLE_S):
        super().__init__(name="timeline-sampler", daemon=True)
        self.period = period
        self.rows: list[tuple[float, dict[int, int], float, float]] = []
        self.names: dict[int, str] = {}
        self._native = 0
        self._stop_event = threading.Event()

    def sample(self) -> None:
        t = time.perf_counter()
        ns = _thread_ns()
        busy, steal = _machine_s()
        self.rows.append((t, ns, busy, steal))
        for th in threading.enumerate():
            if th.native_id is not None:
                self.names.setdefault(th.native_id, th.name)
        for tid in sorted(ns):
            if tid not in self.names:  # a thread Python does not know (the kernels' pool, ONNX Runtime, MLX)
                self._native += 1
                self.names[tid] = f"native-{self._native}"

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.sample()
            self._stop_event.wait(self.period)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()
        self.sample()


def analyse(rows, spans, names: dict[int, str], t0: float, t1: float, skip: set[int],
            bucket: float = BUCKET_S) -> dict[str, Any]:
    """Fold the samples into buckets of ``bucket`` seconds between ``t0`` and ``t1``: per bucket the process's
    cores busy (threads in ``skip`` left out), the machine's busy cores beside it and the stages running; then
    per set of stages the wall time and cores busy, and per thread its core-seconds."""
    n = max(1, int((t1 - t0) / bucket + 0.999))
    cpu = [defaultdict(float) for _ in range(n)]
    machine = [0.0] * n
    steal = [0.0] * n
    for (ta, ra, ba, sa), (tb, rb, bb, sb) in zip(rows, rows[1:]):
        if tb <= t0 or ta >= t1:
            continue
        i = min(n - 1, max(0, int(((ta + tb) / 2 - t0) / bucket)))
        for tid, v in rb.items():  # (a thread new since the previous sample: all its time falls in between)
            if tid not in skip and v > ra.get(tid, 0):
                cpu[i][tid] += (v - ra.get(tid, 0)) / 1e9
        machine[i] += bb - ba
        steal[i] += sb - sa
    labels = []
    for i in range(n):
        a, b = t0 + i * bucket, t0 + (i + 1) * bucket
        active = sorted({name for name, _tid, s, e in spans if s < b and e > a})
        labels.append("+".join(active) or "(no stage)")
    groups: dict[str, dict[str, Any]] = {}
    threads: dict[str, float] = defaultdict(float)
    for i in range(n):
        g = groups.setdefault(labels[i], {"wall_s": 0.0, "cpu_s": 0.0, "threads": defaultdict(float)})
        g["wall_s"] += bucket
        for tid, s in cpu[i].items():
            g["cpu_s"] += s
            g["threads"][names.get(tid, str(tid))] += s
            threads[names.get(tid, str(tid))] += s
    for g in groups.values():
        g["cores"] = g["cpu_s"] / g["wall_s"]
        g["threads"] = dict(sorted(g["threads"].items(), key=lambda kv: -kv[1]))
    wall = t1 - t0
    cpu_s = sum(threads.values())
    ours_machine = [sum(c.values()) for c in cpu]
    return {
        "wall_s": wall,
        "cpu_s": cpu_s,
        "cores": cpu_s / wall,
        "others_cores": max(0.0, (sum(machine) - cpu_s) / wall),  # the machine's busy time beside this process
        "steal_cores": sum(steal) / wall,
        "groups": groups,
        "threads": dict(sorted(threads.items(), key=lambda kv: -kv[1])),
        "buckets": [{"t": round(i * bucket, 3), "cores": ours_machine[i] / bucket, "stages": labels[i],
                     "threads": {names.get(tid, str(tid)): s / bucket for tid, s in
                                 sorted(cpu[i].items(), key=lambda kv: -kv[1]) if s / bucket >= 0.05}}
                    for i in range(n)],
    }


def run_one(text: str, split: str) -> dict[str, Any]:
    """In this process (its thread count already set): one whole and one streamed synthesis, sampled."""
    from ..engine import GPTSoVITSEngine
    from ..engine.stats import recording_spans
    from ..settings import process_setting
    from .measure import _preload_blas
    from .weights import bench_voice, default_models_dir, ensure_models

    _preload_blas()
    root = ensure_models(default_models_dir())
    spec = bench_voice(root)
    engine = GPTSoVITSEngine(model_dir=root)
    engine.load_voice(spec)
    opts = {"text_split_method": split, "top_k": 15, "seed": 1}
    marks: dict[str, float] = {}

    def whole():
        engine.synthesize(text, voice=spec, **opts)

    def streamed():
        first = None
        for _ in engine.synthesize_stream(text, voice=spec, **opts):
            if first is None:
                first = time.perf_counter()
        marks["first_audio"] = first

    whole()
    streamed()  # warm-up: every shape once
    out: dict[str, Any] = {"threads": process_setting("threads"), "backends": engine.stats().get("backends")}
    for mode, fn in (("whole", whole), ("stream", streamed)):
        sampler = Sampler()
        sampler.start()
        time.sleep(3 * SAMPLE_S)
        with recording_spans() as spans:
            t0 = time.perf_counter()
            fn()
            t1 = time.perf_counter()
        sampler.stop()
        res = analyse(sampler.rows, spans, sampler.names, t0, t1, skip={sampler.native_id})
        if mode == "stream" and marks.get("first_audio"):
            res["first_audio_s"] = marks["first_audio"] - t0
        out[mode] = res
    return out


def _fmt_threads(threads: dict[str, float], limit: int = 4) -> str:
    return ", ".join(f"{name} {s:.2f}" for name, s in list(threads.items())[:limit] if s >= 0.005)


def report(results: dict[int, dict[str, Any]], text: str, buckets: bool = True) -> str:
    lines = [f"text: {text}"]
    for threads, res in results.items():
        if "error" in res:
            lines.append(f"\n{threads} thread(s): error: {res['error']}")
            continue
        for mode in ("whole", "stream"):
            r = res[mode]
            head = (f"\n{threads} thread(s), {mode}: {r['wall_s']:.2f} s wall, {r['cpu_s']:.2f} core-s, "
                    f"{r['cores']:.2f} cores busy on average; beside it the machine: {r['others_cores']:.2f} "
                    f"cores busy, {r['steal_cores']:.2f} stolen")
            if "first_audio_s" in r:
                head += f"; first audio at {r['first_audio_s']:.2f} s"
            lines.append(head)
            lines.append(f"  {'stages running':34s} {'wall s':>7s} {'cores':>6s}  threads (core-s)")
            for label, g in sorted(r["groups"].items(), key=lambda kv: -kv[1]["wall_s"]):
                lines.append(f"  {label[:34]:34s} {g['wall_s']:7.2f} {g['cores']:6.2f}  {_fmt_threads(g['threads'])}")
            lines.append(f"  threads, core-s: {_fmt_threads(r['threads'], 8)}")
            if buckets:
                lines.append(f"  timeline ({BUCKET_S:g} s rows): t, cores busy, stages, threads (cores)")
                for b in r["buckets"]:
                    bar = "#" * round(b["cores"] * 10)
                    lines.append(f"  {b['t']:6.1f} {b['cores']:4.2f} {bar:22s} {b['stages'][:28]:28s} "
                                 + " ".join(f"{k} {v:.2f}" for k, v in b["threads"].items()))
    return "\n".join(lines)


def run_timeline(args) -> int:
    if not os.path.isdir("/proc/self/task"):
        print("error: --timeline reads /proc (Linux only)", file=sys.stderr)
        return 2
    from ..settings import child_env
    from .weights import TARGET_TEXT, default_models_dir, ensure_models

    ensure_models(default_models_dir())  # once, before the timed processes
    text = args.text or TARGET_TEXT
    results: dict[int, dict[str, Any]] = {}
    for t in (int(x) for x in args.threads.split(",")):
        env = child_env(PRIMESPEECH_THREADS=str(t))
        code = ("import json, sys; from dora_primespeech_mlx.bench import timeline as t; "
                "print('TIMELINE ' + json.dumps(t.run_one(sys.argv[1], sys.argv[2]), default=str))")
        proc = subprocess.run([sys.executable, "-c", code, text, args.split], env=env, capture_output=True,
                              text=True, timeout=args.side_timeout)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("TIMELINE ")), None)
        if proc.returncode != 0 or line is None:
            results[t] = {"error": f"rc {proc.returncode}: {proc.stderr.strip()[-400:]}"}
        else:
            results[t] = json.loads(line[len("TIMELINE "):])
        print(f"timeline: {t} thread(s) done", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps({"text": text, "results": results}, ensure_ascii=False))
    else:
        print(report(results, text))
    return 0 if all("error" not in r for r in results.values()) else 1
