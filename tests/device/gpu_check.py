"""The GPU check (docs/gpu.md): this package's MLX paths on a GPU against the original's golden data, then the
real-size random-weight models end to end, in one command per device call.

Parts (one device call each, see pack.py's PARTS for the fixture files each carries):

- ``fixtures``: the project's own fixture tests (tests/models, tests/engine: their case loops, loaders and
  tolerances, unchanged) with MLX's default device set to ``--device``, once per variant of the engine settings
  (``VARIANTS``); one JSON line per test, with the errors the tests print beside their tolerances. A variant marked
  informational (float16 storage) is reported with its errors, not counted as a failure;
- ``bigset`` (``--bigset``, the ``core`` part): the bench's real-size random-weight v2 models (bench/weights.py,
  built on the device) through the engine: whole and streamed (first audio), one and three sentences, GPT tokens
  per second and SoVITS seconds per second of audio from the engine's own stage timings, and the rows decoded per
  GPT step (``PRIMESPEECH_BATCH`` 1, 4, 8 over eight sentences); each configuration in its own process.

Everything goes to ``--out``: ``check.jsonl`` (every line) and ``summary.md`` (the tables). On the CPU
(``--device cpu``) the same code runs in the normal test suite (tests/device/test_gpu_check.py).

usage: python tests/device/gpu_check.py --part core --device gpu --fixtures .devpack/fix-core --out $OUT --bigset
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TESTS = REPO / "tests"

# part -> (test files, pytest -k expression or None); the engine tests that need the English front end (not
# carried) are left out
_ENGINE_K = "golden or reference_prompt or stream_matches"
PART_TESTS: dict[str, list[tuple[str, str | None]]] = {
    "core": [("models/test_t2s.py", None), ("models/test_t2s_batch.py", None), ("models/test_hubert.py", None),
             ("models/test_bert.py", None), ("models/test_v2pro.py", "sv")],
    "v2": [("models/test_sovits.py", None), ("models/test_sovits_conv.py", None), ("engine/test_engine.py", _ENGINE_K),
           ("engine/test_engine_stream.py", None), ("engine/test_engine_batch.py", None)],
    "v2pro": [("models/test_v2pro.py", None), ("engine/test_engine_v2pro.py", _ENGINE_K)],
    "v2proplus": [("models/test_v2pro.py", None), ("engine/test_engine_v2pro.py", _ENGINE_K)],
}
# variant -> (engine settings, informational); the settings reach the engine tests (Settings.from_env), the model
# tests run each path they parametrize themselves (decoders, convolution implementations, BERT storage)
VARIANTS: dict[str, tuple[dict[str, str], bool]] = {
    "default": ({}, False),
    "mlx-step": ({"PRIMESPEECH_T2S_DECODE": "mlx", "PRIMESPEECH_T2S_COMPILE": "0"}, False),
    "gemm-conv": ({"PRIMESPEECH_CONV_IMPL": "gemm"}, False),
    "bert-float16": ({"PRIMESPEECH_BERT_HALF": "1"}, True),
}
ENGINE_ONLY = {"mlx-step", "gemm-conv", "bert-float16"}  # these variants change nothing in the model tests: they
VARIANT_FILES = {"engine/test_engine.py", "engine/test_engine_v2pro.py"}  # run the engine's golden tests only
SENTENCE = "今天的天气特别好，我们一起去公园里散步聊天吧。"
BATCH_ROWS = (1, 4, 8)


class Clock:
    """The command's time budget: phases not started before it runs out are reported as not run."""

    def __init__(self, budget_s: float):
        self.start, self.budget_s = time.monotonic(), budget_s

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.start)


def write(out: Path, row: dict) -> None:
    with open(out / "check.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")


def child_env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


# ---- fixtures ---------------------------------------------------------------------------------------------------


def run_fixtures(a, out: Path, clock: Clock) -> None:
    """Each variant's pytest run over the part's test files; the plugin writes the lines."""
    for variant in a.variants:
        settings, info = VARIANTS[variant]
        targets = [(f, k) for f, k in PART_TESTS[a.part] if variant not in ENGINE_ONLY or f in VARIANT_FILES]
        if not targets:
            continue
        for path, k in targets:
            if clock.left() < 20:
                write(out, {"phase": "fixtures", "variant": variant, "file": path, "outcome": "not run",
                            "message": "time budget"})
                continue
            select = " and ".join(f"({e})" for e in (k, a.select) if e)
            cmd = [sys.executable, "-m", "pytest", "-n", "0", "-q", "-p", "gpu_plugin", "-p", "no:cacheprovider",
                   "--rootdir", str(REPO), str(TESTS / path), *(["-k", select] if select else []),
                   *([] if a.quick else ["--full"])]
            env = child_env({**settings, "PRIMESPEECH_FIXTURES": str(Path(a.fixtures).resolve()),
                             "PRIMESPEECH_CHECK_DEVICE": a.device, "PRIMESPEECH_CHECK_VARIANT": variant,
                             "PRIMESPEECH_CHECK_JSONL": str(out / "check.jsonl"), "DEVICE": a.device})
            t = time.monotonic()
            try:
                proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True,
                                      timeout=max(10.0, clock.left()))
                code, tail = proc.returncode, (proc.stdout + proc.stderr)[-1500:]
            except subprocess.TimeoutExpired:  # the tests it finished are in the lines; the rest did not run
                write(out, {"phase": "fixtures", "variant": variant, "file": path, "outcome": "not run",
                            "message": "stopped at the time budget"})
                continue
            write(out, {"phase": "pytest", "variant": variant, "file": path, "informational": info, "exit": code,
                        "seconds": round(time.monotonic() - t, 1), "tail": tail if code not in (0, 5) else ""})


# ---- bigset -----------------------------------------------------------------------------------------------------


def engine_voice(models: Path | None, fixtures: Path | None, sentences: int):
    """(voice, text of ``sentences`` sentences, request options): the bench's real-size voice (built once into
    ``models``) speaking the bench sentence, or the tiny fixture voice speaking its e2e case's text (the CPU
    test's; its language is the case's)."""
    from dora_primespeech_mlx.assets.catalog import VoiceSpec

    opts = {"top_k": 15, "seed": 1}
    if fixtures is None:
        from dora_primespeech_mlx.bench.weights import bench_voice, ensure_models

        return bench_voice(ensure_models(models)), SENTENCE * sentences, {**opts, "text_split_method": "cut3"}
    cases = json.loads((fixtures / "models" / "cases.json").read_text(encoding="utf-8"))
    ck, inp = cases["checkpoints"], next(c for c in cases["cases"] if c["name"] == "e2e")["inputs"]
    m = fixtures / "models"
    spec = VoiceSpec(name="tiny", language=inp["text_lang"], prompt_text=inp["prompt_text"],
                     prompt_lang=inp["prompt_lang"], speed_factor=1.0, gpt=m / ck["gpt"], sovits=m / ck["sovits"],
                     reference=m / inp["ref_audio_path"], hubert=m / ck["hubert"], bert=m / ck["bert"],
                     source="custom")
    return spec, " ".join([inp["text"]] * sentences), {**opts, "text_split_method": "cut5"}


def measure_engine(sentences: int, repeat: int, models: Path | None, fixtures: Path | None) -> dict:
    """One configuration in this process: ``sentences`` sentences, whole (``repeat`` runs after a warm-up) and
    streamed (first audio, the same runs); rates from the engine's stage timings."""
    from dora_primespeech_mlx.engine import GPTSoVITSEngine

    spec, text, opts = engine_voice(models, fixtures, sentences)
    scratch = tempfile.mkdtemp(prefix="gpu-check-")
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)  # the models converted there (this process's own)
    engine = GPTSoVITSEngine(model_dir=scratch, device=os.environ.get("DEVICE", "auto"))
    engine.load_voice(spec)
    engine.synthesize(text, voice=spec, **opts)  # warm-up: loads, compiles, caches the reference
    whole, rates = [], []
    for _ in range(repeat):
        t = time.perf_counter()
        r = engine.synthesize(text, voice=spec, **opts)
        whole.append(time.perf_counter() - t)
        tm = r.timings
        rates.append({"tokens": len(r.semantic_tokens), "audio_s": r.duration,
                      "gpt_tokens_per_s": len(r.semantic_tokens) / tm["gpt_decode"] if tm.get("gpt_decode") else None,
                      "sovits_s_per_audio_s": tm["sovits"] / r.duration if tm.get("sovits") else None})
    first, streamed = [], []
    for _ in range(repeat):
        t = time.perf_counter()
        got = None
        for _chunk in engine.synthesize_stream(text, voice=spec, **opts):
            got = got or time.perf_counter() - t
        first.append(got)
        streamed.append(time.perf_counter() - t)
    med = statistics.median
    return {"sentences": sentences, "device": engine.device_name, "runs": repeat,
            "e2e_s": med(whole), "first_audio_s": med(first), "stream_total_s": med(streamed),
            "tokens": rates[-1]["tokens"], "audio_s": rates[-1]["audio_s"],
            "gpt_tokens_per_s": med([x["gpt_tokens_per_s"] for x in rates if x["gpt_tokens_per_s"]] or [0.0]),
            "sovits_s_per_audio_s": med([x["sovits_s_per_audio_s"] for x in rates if x["sovits_s_per_audio_s"]]
                                        or [0.0]),
            "decode_batch": engine.stats().get("decode_batch")}


def run_bigset(a, out: Path, clock: Clock) -> None:
    """Each configuration in its own process (a fresh engine, its own PRIMESPEECH_BATCH)."""
    configs = [(1, 1), (3, 1)] + [(8, b) for b in BATCH_ROWS]
    for sentences, batch in configs:
        name = f"{sentences} sentence(s), batch {batch}"
        if clock.left() < 30:
            write(out, {"phase": "bigset", "config": name, "outcome": "not run", "message": "time budget"})
            continue
        cmd = [sys.executable, str(Path(__file__).resolve()), "engine", "--sentences", str(sentences),
               "--repeat", str(a.repeat), "--models", str(Path(a.models).resolve())]
        if a.tiny:
            cmd += ["--tiny", str(Path(a.fixtures).resolve())]
        env = child_env({"DEVICE": a.device, "PRIMESPEECH_BATCH": str(batch)})
        t = time.monotonic()
        try:
            proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True,
                                  timeout=max(10.0, clock.left()))
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ENGINE ")]
            row = json.loads(lines[-1][7:]) if lines else {"outcome": "failed", "tail": proc.stderr[-1500:]}
        except subprocess.TimeoutExpired:
            row = {"outcome": "not run", "message": "stopped at the time budget"}
        write(out, {"phase": "bigset", "config": name, "batch": batch, "seconds": round(time.monotonic() - t, 1),
                    **row})


# ---- summary ----------------------------------------------------------------------------------------------------


def read_rows(out: Path) -> list[dict]:
    path = out / "check.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def summary(rows: list[dict], head: dict) -> str:
    """Markdown: the fixture tests per variant (counts, failures with their message and printed errors, the
    informational variants' errors) and the real-size set's table."""
    lines = [f"# GPU check: part {head.get('part')} on {head.get('device_name')}", "",
             f"MLX {head.get('mlx')}, Python {head.get('python')}, {head.get('seconds', 0):.0f} s.", ""]
    for name, r in (head.get("smoke") or {}).items():
        lines.append(f"- {name}: " + (r["error"] if "error" in r else
                                      f"first call {r['first_s']} s, second {r['second_s']} s, "
                                      f"max abs error {r['max_abs_err']:.2g}"))
    lines += [""] if head.get("smoke") else []
    tests = [r for r in rows if r.get("phase") == "fixtures" and "test" in r]
    informational = {v for v, (_, i) in VARIANTS.items() if i}
    if tests:
        lines += ["| variant | passed | failed | skipped |", "|---|---|---|---|"]
        for v in dict.fromkeys(r["variant"] for r in tests):
            mine = [r for r in tests if r["variant"] == v]
            n = {o: sum(r["outcome"] == o for r in mine) for o in ("passed", "failed", "skipped")}
            mark = " (informational: float16 storage)" if v in informational else ""
            lines.append(f"| {v}{mark} | {n['passed']} | {n['failed']} | {n['skipped']} |")
        bad = [r for r in tests if r["outcome"] == "failed"]
        if bad:
            lines += ["", "Failures (informational variants: their error against the float32 tolerance):", ""]
            lines += [f"- `{r['variant']}` `{r['test']}`: {r.get('message', '')}"
                      + "".join(f"\n  - {e}" for e in r.get("errors", [])[:4]) for r in bad]
        errs = [r for r in tests if r["outcome"] == "passed" and r.get("errors")]
        if errs:
            lines += ["", "<details><summary>errors printed by passing tests</summary>", ""]
            lines += [f"- `{r['variant']}` `{r['test']}`: " + " / ".join(r["errors"][:3]) for r in errs]
            lines += ["", "</details>"]
    broken = [r for r in rows if r.get("phase") == "pytest" and r.get("exit") not in (0, 1, 5)]
    lines += [f"\npytest `{r['file']}` ({r['variant']}) exit {r['exit']}:\n```\n{r.get('tail', '')}\n```"
              for r in broken]
    big = [r for r in rows if r.get("phase") == "bigset"]
    if big:
        lines += ["", "| configuration | e2e s | first audio s | stream total s | tokens | audio s | GPT tok/s | "
                  "SoVITS s per s audio |", "|---|---|---|---|---|---|---|---|"]
        for r in big:
            if "e2e_s" not in r:
                why = " ".join(str(r.get("message") or r.get("tail", "")).split())[-300:].replace("|", "/")
                lines.append(f"| {r['config']} | {r.get('outcome')}: {why} | | | | | | |")
                continue
            lines.append(f"| {r['config']} | {r['e2e_s']:.3f} | {r['first_audio_s']:.3f} | {r['stream_total_s']:.3f}"
                         f" | {r['tokens']} | {r['audio_s']:.2f} | {r['gpt_tokens_per_s']:.1f} | "
                         f"{r['sovits_s_per_audio_s']:.4f} |")
        lines += ["", "The original on CUDA: not run by this script (docs/gpu.md says what it needs)."]
    not_run = [r for r in rows if r.get("outcome") == "not run"]
    lines += [f"- not run: {r.get('config') or r.get('variant') + ' ' + r.get('file', '')} ({r.get('message')})"
              for r in not_run]
    return "\n".join(lines) + "\n"


def failed(rows: list[dict]) -> bool:
    """Whether the check failed: a smoke operation, a counted fixture test, a pytest run that broke, or a bigset
    configuration (the informational variants' failures do not count)."""
    informational = {v for v, (_, i) in VARIANTS.items() if i}
    checks = (
        any("error" in v for r in rows if r.get("phase") == "environment" for v in (r.get("smoke") or {}).values()),
        any(r.get("phase") == "fixtures" and r.get("outcome") == "failed" and r.get("variant") not in informational
            for r in rows),
        any(r.get("phase") == "pytest" and r.get("exit") not in (0, 1, 5) for r in rows),
        any(r.get("phase") == "bigset" and r.get("outcome") == "failed" for r in rows),
    )
    return any(checks)


def environment(a) -> dict:
    import platform

    import mlx.core as mx

    if not hasattr(mx, "array"):  # the extension did not load: a namespace package of the site's folders
        raise SystemExit(f"error: MLX did not load under Python {platform.python_version()} (the pack's site is "
                         "built for CPython 3.12)")
    if a.device == "gpu" and not mx.is_available(mx.gpu):
        raise SystemExit("error: --device gpu but this MLX has no GPU backend (mlx-cuda-13 not installed?)")
    mx.set_default_device(mx.gpu if a.device == "gpu" else mx.cpu)
    return {"phase": "environment", "part": a.part, "mlx": mx.__version__, "python": platform.python_version(),
            "device_name": str(mx.default_device()),
            "gpu": mx.device_info() if a.device == "gpu" and hasattr(mx, "device_info") else None}


def smoke() -> dict:
    """A few MLX operations on the default device, each timed on its first call (which compiles its kernels) and
    its second, checked against numpy: the first thing to read when the fixture tests fail wholesale."""
    import mlx.core as mx
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 96)).astype(np.float32), rng.standard_normal((96, 32)).astype(np.float32)
    x, w = rng.standard_normal((1, 50, 8)).astype(np.float32), rng.standard_normal((4, 3, 8)).astype(np.float32)
    ops = {
        "matmul": (lambda: mx.matmul(mx.array(a), mx.array(b)), a @ b),
        "matmul_float16": (lambda: mx.matmul(mx.array(a, mx.float16), mx.array(b, mx.float16)).astype(mx.float32),
                           a @ b),
        "conv1d": (lambda: mx.conv1d(mx.array(x), mx.array(w)),
                   np.stack([np.einsum("tc,ktc->k", x[0, i:i + 3], w) for i in range(48)])[None]),
        "compile": (mx.compile(lambda: mx.tanh(mx.array(a)) * 2 + 1), np.tanh(a) * 2 + 1),
    }
    out = {}
    for name, (fn, want) in ops.items():
        try:
            times = []
            for _ in range(2):
                t = time.perf_counter()
                got = np.array(fn())
                times.append(round(time.perf_counter() - t, 4))
            out[name] = {"first_s": times[0], "second_s": times[1],
                         "max_abs_err": float(np.max(np.abs(got - want)))}
        except Exception as exc:  # recorded, not raised: the summary names it
            out[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["engine"]:  # one bigset configuration, in a child process
        ap = argparse.ArgumentParser()
        ap.add_argument("engine")
        ap.add_argument("--sentences", type=int, default=1)
        ap.add_argument("--repeat", type=int, default=3)
        ap.add_argument("--models", required=True)
        ap.add_argument("--tiny", help="the fixture root: the tiny fixture voice instead of the real-size set")
        e = ap.parse_args(argv)
        res = measure_engine(e.sentences, e.repeat, Path(e.models), Path(e.tiny) if e.tiny else None)
        print("ENGINE " + json.dumps(res, default=str))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=sorted(PART_TESTS) + ["all"], default="core")
    ap.add_argument("--device", choices=["gpu", "cpu"], default="gpu")
    ap.add_argument("--fixtures", required=True, help="the fixture root this call carries")
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu-check-out"))
    ap.add_argument("--variants", default=None, help="comma list (default: all on the GPU, 'default' on the CPU)")
    ap.add_argument("--select", help="pytest -k expression added to every run (the CPU test's subset)")
    ap.add_argument("--quick", action="store_true", help="the fixture tests' quick tier (sampled rows), not --full")
    ap.add_argument("--bigset", action="store_true", help="also the real-size random-weight models end to end")
    ap.add_argument("--tiny", action="store_true", help="bigset with the tiny fixture voice (for the CPU test)")
    ap.add_argument("--models", default=str(REPO / ".devsite-models"), help="where the real-size set is built")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per bigset configuration")
    ap.add_argument("--budget-s", type=float, default=480.0, help="stop starting phases after this (default 480)")
    a = ap.parse_args(argv)
    a.variants = (a.variants or ("default" if a.device == "cpu" else ",".join(VARIANTS))).split(",")
    unknown = set(a.variants) - set(VARIANTS)
    if unknown:
        ap.error(f"unknown variants {sorted(unknown)} (use {', '.join(VARIANTS)})")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "check.jsonl").unlink(missing_ok=True)  # this run's lines only
    clock = Clock(a.budget_s)
    head = environment(a)
    head["smoke"] = smoke()
    write(out, head)
    parts = list(PART_TESTS) if a.part == "all" else [a.part]
    for part in parts:
        a.part = part
        run_fixtures(a, out, clock)
    if a.bigset:
        run_bigset(a, out, clock)
    head.update(part=",".join(parts), seconds=time.monotonic() - clock.start)
    rows = read_rows(out)
    text = summary(rows, head)
    (out / "summary.md").write_text(text, encoding="utf-8")
    print(text)
    return 1 if failed(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
