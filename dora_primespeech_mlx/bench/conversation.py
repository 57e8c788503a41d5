"""``primespeech-mlx bench --conversation``: a simulated LLM answer spoken as it is written ("first words fast,
then no gap").

An LLM stand-in writes a 3-5 sentence answer at a fixed rate; ``ours`` (the node's message handler and engine in
one process) gets it as fragments of one utterance (or, for a node that does not join fragments, sentence by
sentence), ``upstream`` (the original GPT-SoVITS in ``streaming_mode``) each sentence as it completes. A player
reports first audio, playback gaps and the time from the last token to the last audio, per side, sides
alternating within every round. What it measures and how to run it: docs/conversation.md. Not a test: compare
sides within one run.

This file runs as a script in the side processes (``python conversation.py ours|upstream ...``), so it imports the
package absolutely, from the checkout on ``PYTHONPATH``."""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ANSWERS = {
    "zh": ["好的，我们来看看这个周末可以去哪里玩。", "城市东边新开了一座植物园，里面有很多热带植物。",
           "如果天气好，上午可以去植物园，下午去湖边散步。", "晚上再找一家安静的小饭馆，吃一顿简单的晚饭。",
           "你觉得这个安排怎么样？"],
    "en": ["Sure, let us see where we could go this weekend.",
           "A new botanical garden has opened on the east side of the city, with many tropical plants.",
           "If the weather is good, we can visit the garden in the morning and walk by the lake later.",
           "In the evening we can find a quiet little restaurant for a simple dinner.",
           "What do you think of this plan?"],
}
METRICS = ("first_audio", "gap_total", "gap_worst", "last_audio", "playback_end")


@dataclass
class Script:
    """The LLM's answer: its tokens with the second each is written (from the answer's start), and the sentences
    with the second of each one's end mark."""

    tokens: list[str]
    times: list[float]
    sentences: list[str] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)


def tokenize(text: str, lang: str) -> list[str]:
    """LLM-like tokens: one per Chinese character; English words and punctuation marks, each with its leading
    whitespace."""
    if lang == "zh":
        return list(text)
    return re.findall(r"\s*\w+|\s*[^\w\s]", text)


def llm_script(sentences: list[str], lang: str, rate: float) -> Script:
    """The answer written at ``rate`` tokens per second: token ``i`` at ``(i + 1) / rate``."""
    script = Script([], [])
    for s in sentences:
        for tok in tokenize(s if lang == "zh" or not script.tokens else " " + s, lang):
            script.tokens.append(tok)
            script.times.append(len(script.tokens) / rate)
        script.sentences.append(s)
        script.ends.append(script.times[-1])
    return script


def playback(arrivals: list[tuple[float, float]]) -> tuple[list[float], float]:
    """(the wait before each chunk after the first, the end of playback) for chunks (arrival s, duration s) in
    arrival order, each played when it has arrived and the one before has finished."""
    gaps, until = [], None
    for at, duration in arrivals:
        if until is not None:
            gaps.append(max(0.0, at - until))
        until = max(at, until if until is not None else at) + duration
    return gaps, until if until is not None else 0.0


def metrics(script: Script, arrivals: list[tuple[float, float]]) -> dict[str, float]:
    """The run's figures (seconds; see the module docstring) from its script and audio timeline (both measured
    from the answer's start)."""
    if not arrivals:
        raise ValueError("no audio arrived")
    gaps, end = playback(arrivals)
    last_token = script.times[-1]
    return {"first_audio": arrivals[0][0] - script.ends[0], "gap_total": sum(gaps),
            "gap_worst": max(gaps, default=0.0), "gaps": sum(g > 0 for g in gaps), "chunks": len(arrivals),
            "last_audio": arrivals[-1][0] - last_token, "playback_end": end - last_token,
            "audio_s": sum(d for _, d in arrivals)}


def feed(script: Script, send, fragments: bool, t0: float) -> None:
    """Call ``send(text, metadata)`` as the LLM writes: each token (fragments) or each sentence at its end mark."""
    items = ([(t, tok, {"seq": i, "fin": i == len(script.tokens) - 1}) for i, (t, tok) in
              enumerate(zip(script.times, script.tokens))] if fragments else
             [(t, s, {"question_id": f"s{i}"}) for i, (t, s) in enumerate(zip(script.ends, script.sentences))])
    for at, text, meta in items:
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        send(text, meta)


# ---- this package's side (a process of its own, the checkout's package on PYTHONPATH) ---------------------------


class Player:
    """The handler's ``send``: audio arrival times and durations, and the answers counted."""

    def __init__(self):
        self.cv = threading.Condition()
        self.audio: list[tuple[float, float]] = []
        self.completed = 0

    def __call__(self, output, array, metadata):
        with self.cv:
            if output == "audio" and not metadata.get("silent"):
                self.audio.append((time.perf_counter(), float(metadata["duration"])))
            elif output == "segment_complete":
                self.completed += 1
            self.cv.notify_all()


_MODEL_DIRS: list[str] = []  # this process's temporary model directories (the converted models: gigabytes)


def remove_model_dirs() -> None:
    """Remove this process's temporary model directories (at exit; a side process ends with ``os._exit``, which
    skips ``atexit``, so it calls this first)."""
    while _MODEL_DIRS:
        shutil.rmtree(_MODEL_DIRS.pop(), ignore_errors=True)


def voice_dir(models: str | None, tiny: str | None) -> tuple[str, str, str]:
    """(model dir with the voice, voice name, its language): the real-size set as "Big", or the fixture voice."""
    import yaml

    md = tempfile.mkdtemp(prefix="conversation-")
    _MODEL_DIRS.append(md)
    atexit.register(remove_model_dirs)
    if tiny:
        root = Path(tiny) / "models"
        cases = json.loads((root / "cases.json").read_text(encoding="utf-8"))
        ck, inp = cases["checkpoints"], next(c for c in cases["cases"] if c["name"] == "e2e")["inputs"]
        voice = {"name": "Tiny", "language": inp["text_lang"], "prompt_text": inp["prompt_text"],
                 "prompt_lang": inp["prompt_lang"], "reference": str(root / inp["ref_audio_path"]),
                 **{k: str(root / ck[k]) for k in ("gpt", "sovits", "hubert", "bert")}}
    elif os.path.isfile(os.path.join(models, "gpt", "model.safetensors")):  # the bench's own set (bench/weights.py)
        from dora_primespeech_mlx.bench.weights import PROMPT_TEXT

        voice = {"name": "Big", "language": "zh", "prompt_text": PROMPT_TEXT, "prompt_lang": "zh",
                 "reference": os.path.join(models, "reference.wav"),
                 **{k: os.path.join(models, k) for k in ("gpt", "sovits", "hubert", "bert")}}
    else:
        if not os.path.isfile(os.path.join(models, "ref_5s_32k.wav")):
            raise SystemExit(f"no {models}/ref_5s_32k.wav: the original's side (--upstream) or the compare tools' "
                             "sidebyside.py writes it on its first run")
        voice = {"name": "Big", "language": "zh", "prompt_text": "这是一段用于测试的参考音频。", "prompt_lang": "zh",
                 "reference": os.path.join(models, "ref_5s_32k.wav"),
                 "gpt": os.path.join(models, "gpt", "s1-v2-random.ckpt"),
                 "sovits": os.path.join(models, "sovits", "s2G-v2-random.pth"),
                 "hubert": os.path.join(models, "chinese-hubert-base"),
                 "bert": os.path.join(models, "chinese-roberta-wwm-ext-large")}
    folder = Path(md) / "voices" / voice["name"]
    folder.mkdir(parents=True)
    (folder / "voice.yaml").write_text(yaml.safe_dump(voice, allow_unicode=True), encoding="utf-8")
    return md, voice["name"], voice["language"]


def side_settings(model_dir: str, voice: str, threads: int | None, split: str,
                  settings: dict[str, str] | None = None) -> dict[str, str]:
    """This package's settings on a side: the in-process handler's table, and the node's ``env`` under ``dora run``
    (bench/conversation_dora.py), so both modes speak with the same ones (``TEXT_LANG`` is added per answer)."""
    base = {"VOICE_NAME": voice, "PRIMESPEECH_MODEL_DIR": model_dir, "STREAMING": "true", "SEED": "1",
            "TOP_K": "15", "GPTSVITS_WARMUP": "false", "LOG_LEVEL": "WARNING", "TEXT_SPLIT_METHOD": split,
            **(settings or {})}
    if threads:  # the settings come from this table, not the environment: --threads is the plan's most
        base.setdefault("PRIMESPEECH_THREADS", str(threads))
    return base


class OursSide:
    """The node's message handler and engine of the checkout on PYTHONPATH, one engine for every run."""

    def __init__(self, models: str | None, tiny: str | None, threads: int | None, split: str,
                 settings: dict[str, str] | None = None):
        from dora_primespeech_mlx.engine.startup import start_engine
        from dora_primespeech_mlx.settings import Settings

        md, self.voice, self.language = voice_dir(models, tiny)
        self.base = side_settings(md, self.voice, threads, split, settings)
        self.settings = Settings.from_env(self.base)
        self.engine, self.spec = start_engine(self.settings, lambda _m: None)
        self.fragments: bool | None = None

    def handler(self, lang: str, player: Player):
        from dora_primespeech_mlx.dataflow.handler import MessageHandler
        from dora_primespeech_mlx.dataflow.transport import DirectTransport
        from dora_primespeech_mlx.settings import Settings

        settings = Settings.from_env({**self.base, "TEXT_LANG": lang})
        h = MessageHandler(settings, lambda _p: (self.engine, self.spec), DirectTransport(player))
        h.start()
        if not h.ready.wait(120) or h.startup_error is not None:
            raise RuntimeError(f"the handler did not start: {h.startup_error}")
        return h

    def probe_fragments(self, lang: str) -> bool:
        """Whether this node joins fragments into one utterance: two fragments of one segment get one answer
        (a node without token streams answers each as a text of its own)."""
        import pyarrow as pa

        player = Player()
        h = self.handler(lang, player)
        first, second = ("你好，", "谢谢。") if lang == "zh" else ("Hello,", " thanks.")
        for seq, (text, fin) in enumerate(((first, False), (second, True))):
            h.on_input("text", pa.array([text]), {"session_id": "probe", "segment_id": 0, "seq": seq, "fin": fin})
        with player.cv:
            player.cv.wait_for(lambda: player.completed >= 1, 120)
        h.finish(60)  # speaks what is still queued: the second answer of a node that answers each fragment
        return player.completed == 1

    def run(self, script: Script, lang: str, run_id: int) -> dict:
        import pyarrow as pa

        if self.fragments is None:
            self.fragments = self.probe_fragments(lang)
        player = Player()
        h = self.handler(lang, player)
        expected = 1 if self.fragments else len(script.sentences)

        def send(text, meta):
            meta = {"session_id": "conversation", **meta}
            if self.fragments:
                meta["segment_id"] = run_id
            h.on_input("text", pa.array([text]), meta)

        t0 = time.perf_counter()
        feed(script, send, self.fragments, t0)
        with player.cv:
            if not player.cv.wait_for(lambda: player.completed >= expected, 600):
                raise RuntimeError(f"{player.completed} of {expected} answers after 600 s")
        h.finish(60)
        out = metrics(script, [(at - t0, d) for at, d in player.audio])
        out["fed"] = "fragments" if self.fragments else "sentences"
        plan = getattr(self.engine, "threads", None)  # the thread plan's last decision (threads.py; a checkout
        if hasattr(plan, "describe"):                 # without one has none)
            described = plan.describe()
            out["threads_used"], out["threads_why"] = described.get("threads"), described.get("reason")
        return out


def side_parser():
    """The arguments of a side's process (also how bench/conversation_dora.py reads a side's command)."""
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("side", choices=["ours", "upstream"])
    ap.add_argument("--langs", default="zh,en")
    ap.add_argument("--rates", default="20,60")
    ap.add_argument("--sentences", type=int, default=4)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--models")
    ap.add_argument("--tiny")
    ap.add_argument("--tools")
    ap.add_argument("--split", default="cut0")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a setting of this side")
    ap.add_argument("--gate", action="store_true",
                    help="after the warm-up print WARM and wait for a line on standard input (the orchestrator "
                         "starts a co-tenant in between)")
    return ap


def side_main(argv: list[str], upstream: type | None = None) -> int:
    """A side's process: one warm-up per language, then every (language, rate) ``--runs`` times; one ``CONV {json}``
    line each. ``upstream``: the original's side (``tests/tools/conversation_upstream.py`` passes it; the package
    holds no PyTorch code)."""
    a = side_parser().parse_args(argv)
    side = (OursSide(a.models, a.tiny, a.threads, a.split, dict(kv.split("=", 1) for kv in a.set)) if a.side == "ours"
            else _upstream(upstream)(a.models, a.tools, a.threads, a.split))
    langs = a.langs.split(",")
    if a.tiny:  # the fixture voice speaks its own language only
        langs = tiny_langs(langs, side.language)
    rates = [float(r) for r in a.rates.split(",")]
    for lang in langs:  # loads, compiles and caches the reference, and each language's front end (a node's
        side.run(llm_script(ANSWERS[lang][:2], lang, max(rates)), lang, 0)  # warm-up does that too)
    if a.gate:
        print("WARM", flush=True)
        sys.stdin.readline()
    run_id = 1
    for _ in range(a.runs):
        for lang in langs:
            for rate in rates:
                res = side.run(llm_script(ANSWERS[lang][:a.sentences], lang, rate), lang, run_id)
                run_id += 1
                res.update(lang=lang, rate=rate, sentences=a.sentences, threads=a.threads, split=a.split,
                           loadavg=os.getloadavg()[0])
                print("CONV " + json.dumps(res), flush=True)
    return 0


def tiny_langs(langs: list[str], language: str) -> list[str]:
    """The answer languages (keys of :data:`ANSWERS`) a fixture voice of ``language`` speaks: those of its
    language's family (``all_zh``: ``zh``), whichever of ``langs`` it is."""
    from dora_primespeech_mlx.text.llm import language_family

    family = language_family(language)
    if family not in ANSWERS:
        raise SystemExit(f"the fixture voice's language {language!r} has no answers here (answers: "
                         f"{', '.join(ANSWERS)})")
    return [x for x in langs if x == family] or [family]


def _upstream(side: type | None) -> type:
    if side is None:
        raise SystemExit("the original's side runs from a checkout: tests/tools/conversation_upstream.py")
    return side


UPSTREAM_SCRIPT = Path(__file__).resolve().parents[2] / "tests" / "tools" / "conversation_upstream.py"


# ---- the orchestrator (``primespeech-mlx bench --conversation``) ------------------------------------------------


def side_commands(args) -> dict[str, tuple[list[str], dict[str, str]] | str]:
    """side name -> (argv, environment) or the reason it cannot run."""
    here = str(Path(__file__).resolve())
    common = ["--langs", args.langs, "--rates", args.rates, "--sentences", str(args.sentences), "--runs", "1",
              "--split", args.split]
    from ..settings import Settings, child_env

    base_env = child_env()  # each side's process: this one's environment, its threads set per run
    # A side builds its settings from its own table, not the environment: the text front end's dictionaries
    # (PRIMESPEECH_TEXT_DATA) are this process's setting, handed over (a side's own --set still wins).
    text_data = Settings.from_env(base_env).text_data
    inherited = [f"--set=PRIMESPEECH_TEXT_DATA={text_data}"] if text_data else []
    models = args.ref_big or base_env.get("REF_BIG") or str(Path.home() / ".cache/primespeech-ref/ref-big")
    if not args.tiny and not args.upstream and not os.path.isfile(os.path.join(models, "ref_5s_32k.wav")):
        # no compare tools' set and no original to run: this package's sides run on the bench's own real-size set
        # (same shapes, written torch-free once; not the same random weights, so not beside the original's)
        from dora_primespeech_mlx.bench.weights import default_models_dir, ensure_models

        models = str(ensure_models(default_models_dir()))
    where = ["--tiny", str(Path(args.tiny).resolve())] if args.tiny else ["--models", str(Path(models).resolve())]
    out: dict[str, tuple[list[str], dict[str, str]] | str] = {}
    checkouts = args.ours or [str(Path(__file__).resolve().parents[2])]
    for i, given in enumerate(checkouts):
        path, _, sets = given.partition("@")  # PATH@NAME=VALUE+NAME=VALUE: that checkout with those settings
        extra = inherited + [f"--set={kv}" for kv in sets.split("+") if kv]
        name = f"ours:{Path(path).resolve().name}" + (f"@{sets}" if sets else "")
        name += f"#{i}" if len(checkouts) > 1 else ""
        if not (Path(path) / "dora_primespeech_mlx").is_dir():
            out[name] = f"not run: no dora_primespeech_mlx package in {path}"
            continue
        pythonpath = os.pathsep.join([str(Path(path).resolve()), base_env.get("PYTHONPATH", "")])
        env = dict(base_env, PYTHONPATH=pythonpath)
        out[name] = ([sys.executable, here, "ours", *common, *where, *extra], env)
    if args.upstream:
        from .compare import find_tools

        tools = find_tools(args.compare_tools)
        if args.tiny:
            out["upstream"] = "not run: the original's side needs the real-size set (--models), not --tiny"
        elif tools is None:
            out["upstream"] = "not run: no compare tools (shared/tools/compare; --compare-tools)"
        elif not UPSTREAM_SCRIPT.is_file():
            out["upstream"] = f"not run: the original's side is {UPSTREAM_SCRIPT.name} of a checkout (tests/tools)"
        elif not Path(models, "gpt", "s1-v2-random.ckpt").is_file():
            out["upstream"] = f"not run: no real-size set in {models} (make_big.py)"
        else:
            out["upstream"] = ([args.upstream, str(UPSTREAM_SCRIPT), "upstream", *common, "--models", models,
                                "--tools", str(tools)], dict(base_env))
    return out


def summarize(rows: list[dict]) -> dict[tuple[str, str, str, float], dict[str, float]]:
    """(side, load, language, rate) -> the median of each figure over the runs (load: ``idle`` or the co-tenant's
    spec; its achieved tokens per second too)."""
    groups: dict[tuple[str, str, str, float], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["side"], r.get("load", "idle"), r["lang"], r["rate"]), []).append(r)
    out = {}
    for k, v in groups.items():
        tps = [x["cotenant_tps"] for x in v if x.get("cotenant_tps") is not None]
        out[k] = ({m: statistics.median(x[m] for x in v) for m in METRICS}
                  | {"runs": len(v), "fed": v[0]["fed"], "cotenant_tps": statistics.median(tps) if tps else None})
    return out


def table(summary: dict[tuple[str, str, str, float], dict[str, float]], not_run: dict[str, str]) -> str:
    lines = ["| side | beside | co-tenant tokens/s | lang | tokens/s | fed | runs | first audio s | gap total s | "
             "worst gap s | last token -> last audio s | last token -> playback end s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (side, load, lang, rate), m in sorted(summary.items(), key=lambda kv: (kv[0][2], kv[0][3], kv[0][0],
                                                                              kv[0][1] != "idle", kv[0][1])):
        tps = "–" if m.get("cotenant_tps") is None else f"{m['cotenant_tps']:.1f}"
        lines.append(f"| {side} | {load} | {tps} | {lang} | {rate:g} | {m['fed']} | {m['runs']} | "
                     f"{m['first_audio']:.2f} | {m['gap_total']:.2f} | {m['gap_worst']:.2f} | {m['last_audio']:.2f} | "
                     f"{m['playback_end']:.2f} |")
    lines += [f"- {side}: {why}" for side, why in not_run.items()]
    return "\n".join(lines)


def run_side(argv: list[str], env: dict[str, str], timeout: float, cotenant=None) -> tuple[list[dict], str | None]:
    """One side process (``--gate``); ``cotenant`` (a :class:`.cotenant.CotenantSpec`) runs from the end of the
    side's warm-up to the side's end. (its ``CONV`` rows, each with ``load`` and ``cotenant_tps``; why it failed, or
    None)."""
    from .cotenant import started

    err = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen([*argv, "--gate"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                            text=True)
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    rows, running, figures, problem = [], None, None, None
    try:
        for line in proc.stdout:
            if line == "WARM\n":
                if cotenant is not None:
                    running, problem = started(cotenant, env)
                    if problem:
                        proc.kill()
                        break
                proc.stdin.write("go\n")
                proc.stdin.flush()
            elif line.startswith("CONV "):
                rows.append(json.loads(line[5:]))
        proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if running is not None:
            try:
                figures = running.stop()
            except RuntimeError as exc:
                problem = str(exc)
    if problem is None and (proc.returncode or not rows):
        err.seek(0)
        problem = f"failed (exit {proc.returncode}): " + " ".join(err.read().split()[-40:])
    for r in rows:
        r["load"] = cotenant.text if cotenant is not None else "idle"
        r["cotenant_tps"] = figures["tokens_per_s"] if figures else None
        r["cotenant"] = figures
    return rows, problem


def run_conversation(args, dora_side=None) -> int:
    """The bench's ``--conversation`` run: every side, thread count, load and round; the table (or ``--json``).
    ``dora_side``: how a side runs under ``dora run`` (``--dora``: bench/conversation_dora.py's ``run_dora_side``,
    passed in by the bench's entry, as that module builds on this one)."""
    from .cotenant import parse

    try:
        cotenants = [parse(spec) for spec in (args.cotenant or [])]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sides = side_commands(args)
    runnable = {k: v for k, v in sides.items() if not isinstance(v, str)}
    not_run = {k: v for k, v in sides.items() if isinstance(v, str)}
    rows: list[dict] = []
    threads = [int(t) for t in str(args.threads).split(",")] if args.threads else [None]
    loads = [None, *cotenants]  # idle, then each co-tenant, for every side and thread count
    dora = getattr(args, "dora", None)  # --dora: this package's sides also (only) under a real dora run
    if dora and dora_side is None:
        print("error: --dora: no dora-run side given (bench/conversation_dora.py)", file=sys.stderr)
        return 2
    modes = {"also": ["in-process", "dora run"], "only": ["dora run"]}.get(dora, ["in-process"])
    # the original's side first in the first round: on a fresh compare tools' set it writes the reference wave that
    # this package's sides read (ref_5s_32k.wav); the rounds then alternate as usual
    first = sorted(runnable.items(), key=lambda kv: kv[0] != "upstream")
    for rnd in range(args.rounds):
        order = list(first)
        if rnd % 2:
            order.reverse()  # alternate which side (and which load, which mode) goes first
        for n in threads:
            for name, (argv, env) in order:
                for cotenant in (loads if rnd % 2 == 0 else loads[::-1]):
                    side_modes = modes if name.startswith("ours") else ["in-process"]  # the original: no node
                    for mode in (side_modes if rnd % 2 == 0 else side_modes[::-1]):
                        cmd = argv + (["--threads", str(n)] if n else [])
                        run_env = {**env, "PRIMESPEECH_THREADS": str(n)} if n else env  # read at the side's start
                        if mode == "dora run":
                            got, problem = dora_side(cmd, run_env, args.side_timeout, cotenant)
                        else:
                            got, problem = run_side(cmd, run_env, args.side_timeout, cotenant)
                        label = (f"{name}@{n}t" if n and len(threads) > 1 else name) + (
                            f" ({mode})" if mode == "dora run" else "")
                        if problem:
                            not_run[label + (f" beside {cotenant.text}" if cotenant else "")] = problem
                        for r in got:
                            r.update(side=label, round=rnd, mode=mode)
                            print("CONV " + json.dumps(r), file=sys.stderr, flush=True)
                        rows += got
    if args.json:
        print(json.dumps({"rows": rows, "not_run": not_run}, indent=2))
    else:
        print(table(summarize(rows), not_run) if rows else "\n".join(f"- {k}: {v}" for k, v in not_run.items()))
    return 0 if rows else 1


def add_arguments(p) -> None:
    g = p.add_argument_group("conversation (--conversation)")
    g.add_argument("--conversation", action="store_true",
                   help="an LLM stand-in's answer spoken as it is written: first audio after the first sentence, "
                   "playback gaps, last token to last audio (this package, other checkouts, the original)")
    g.add_argument("--ours", action="append", metavar="PATH[@NAME=VALUE+...]",
                   help="a checkout whose package is one side, optionally with settings (e.g. "
                        ".@PRIMESPEECH_STREAM_START=earliest; repeatable; default: this one)")
    g.add_argument("--upstream", metavar="PYTHON", help="also the original (its venv's python; compare tools' set-up)")
    g.add_argument("--langs", default="zh,en", help="answer languages (default zh,en)")
    g.add_argument("--rates", default="20,60", help="LLM tokens per second (default 20,60)")
    g.add_argument("--sentences", type=int, default=4, choices=range(1, 6), help="sentences per answer (default 4)")
    g.add_argument("--tiny", metavar="FIXTURES", help="the fixture set's tiny voice instead of the real-size set")
    g.add_argument("--dora", nargs="?", const="also", choices=["also", "only"],
                   help="this package's sides also under a real `dora run` (an LLM stand-in node writing the tokens, "
                        "the node, a player node timing arrivals; rows labelled `(dora run)`); `--dora only`: not in "
                        "process (bench/conversation_dora.py)")
    g.add_argument("--cotenant", action="append", metavar="SPEC",
                   help="also run every side beside this co-tenant, from the end of its warm-up to its end (rows "
                        "beside the idle ones; repeatable): loop[:threads=1,mb=400,rate=48,dim=2048] (float32 "
                        "matrix-vector products, memory-bound like a CPU LLM) or llama[:threads=1,rate=0,"
                        "shape=qwen2.5-0.5b,quant=q8_0,python=PATH] (llama.cpp, random weights); see "
                        "bench/cotenant.py. With --startup: the start-up stages idle, then beside each co-tenant")


if __name__ == "__main__":
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
    try:
        code = side_main(sys.argv[1:])
    finally:
        remove_model_dirs()
    sys.stdout.flush()
    os._exit(code)  # not the interpreter's teardown: the engine's native threads may still be winding down
