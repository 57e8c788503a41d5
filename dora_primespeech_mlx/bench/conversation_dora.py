"""``primespeech-mlx bench --conversation --dora``: the conversation bench under a real ``dora run``.

The same answers, rates, settings and figures as the in-process sides of :mod:`.conversation`, but the tokens go
through dora: a writer node (the LLM stand-in) sends them as ``text`` fragments, this package's node
(``python -m dora_primespeech_mlx.node``, what ``dora-primespeech-mlx`` runs) speaks them, and a player node
timestamps each ``audio`` arrival. The player computes the figures with :func:`.conversation.metrics` and writes
them to a JSON file the orchestrator reads. One dataflow per side and answer language (the node's ``TEXT_LANG``).
The nodes run as ``python -m dora_primespeech_mlx.bench.conversation_dora writer|player FILE`` (they import no MLX).
The clock: :func:`writer_main`. What it measures: docs/conversation.md, "Under a real dora run"."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from ..demo.tts_status import start_failure
from ..settings import ZENOH_OVERLAY
from .conversation import (
    ANSWERS,
    Script,
    feed,
    llm_script,
    metrics,
    remove_model_dirs,
    side_parser,
    side_settings,
    tiny_langs,
    voice_dir,
)
from .cotenant import started

SESSION = "conversation"
MODE = "dora run"  # the rows' label: ``<side> (dora run)``
FINISH_GRACE_S = 31536000  # dora 1.1 stops a dataflow silent for 120 s (README, "Idle"); a co-tenant may take longer
POLL_S = 0.05


# ---- the writer node (the LLM stand-in) ---------------------------------------------------------------------------


class Answers:
    """The writer's view of the node's answers: ``segment_complete`` per ``segment_id``; a failed start ends it."""

    def __init__(self, node):
        self.node = node
        self.got: dict[int, str] = {}

    def wait(self, segment: int) -> str:
        while segment not in self.got:
            event = self.node.next()  # blocking: dora-rs 1.1's next(timeout) can lose an event now and then
            if event is None or event["type"] == "STOP":
                raise SystemExit(f"writer: the dataflow closed while waiting for the answer of segment {segment}")
            if event["type"] != "INPUT":
                continue
            md = event.get("metadata") or {}
            if event["id"] == "segment_complete" and md.get("session_id") == SESSION:
                self.got[int(md["segment_id"])] = event["value"][0].as_py()
            elif event["id"] == "status":
                failure = start_failure(_json(event["value"][0].as_py()))
                if failure is not None:
                    raise SystemExit(f"writer: the TTS node could not start: {failure}")
        return self.got[segment]


def _json(text):
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return None


def speak(node, answers: Answers, script: Script, segment: int) -> tuple[float, list[float], str]:
    """Send ``script``'s tokens as fragments of one utterance at its schedule (:func:`.conversation.feed`, as the
    in-process side does), then wait for its answer. (the answer's start, each fragment's send time, both on
    ``time.monotonic()``; the answer: ``completed`` or why not)."""
    import pyarrow as pa

    stamps: list[float] = []

    def send(text, meta):
        stamps.append(time.monotonic())  # the moment the fragment is handed to dora
        node.send_output("text", pa.array([text]), {"session_id": SESSION, "segment_id": segment, **meta})

    t0, start = time.monotonic(), time.perf_counter()
    feed(script, send, True, start)
    return t0, stamps, answers.wait(segment)


def writer_main(plan_file: str) -> int:
    """The LLM stand-in: one warm-up answer (the first two sentences, unmeasured, as a side's warm-up), then the
    ``warm`` file; once the ``go`` file exists (the orchestrator has started a co-tenant, if any) each rate's answer
    ``runs`` times, and after each answer a ``run`` message that describes it to the player.

    The clock: the writer stamps each fragment with ``time.monotonic()`` just before it hands it to dora, and the
    player stamps each ``audio`` arrival with ``time.monotonic()`` as ``next()`` returns it. Both nodes run on this
    machine, and its monotonic clock (``CLOCK_MONOTONIC`` on Linux, the host's uptime clock on macOS) is one clock
    for every process, not set back or forward as the wall clock may be (NTP), so the two stamps subtract exactly;
    dora's own ``timestamp`` metadata is a hybrid wall clock and is not used. The figures' origin is each fragment's
    send time, not its schedule: first audio counts from the moment the first sentence's last fragment was sent, so
    a writer late under load does not make the node look faster."""
    import pyarrow as pa
    from dora import Node

    plan = json.loads(Path(plan_file).read_text(encoding="utf-8"))
    lang, rates, sentences = plan["lang"], [float(r) for r in plan["rates"]], int(plan["sentences"])
    node = Node()
    answers = Answers(node)
    warm = speak(node, answers, llm_script(ANSWERS[lang][:2], lang, max(rates)), 0)[2]
    Path(plan["warm"]).write_text(warm, encoding="utf-8")
    while not Path(plan["go"]).exists():
        time.sleep(POLL_S)
    segment = 1
    for _ in range(int(plan["runs"])):
        for rate in rates:
            script = llm_script(ANSWERS[lang][:sentences], lang, rate)
            t0, stamps, answer = speak(node, answers, script, segment)
            run = {"segment": segment, "lang": lang, "rate": rate, "sentences": sentences, "answer": answer,
                   "sent": [s - t0 for s in stamps], "ends": [script.times.index(e) for e in script.ends], "t0": t0}
            node.send_output("run", pa.array([json.dumps(run)]), {})
            segment += 1
    node.send_output("done", pa.array([True]), {})
    return 0


# ---- the player node ---------------------------------------------------------------------------------------------


def figures(runs: list[dict], audio: dict[int, list[tuple[float, float, str]]],
            answers: dict[int, int] | None = None) -> tuple[list[dict], list[str]]:
    """(one row per run, the problems): each run's figures from the writer's send times (``run``: its ``sent``
    seconds from ``t0``, the tokens that end sentences, ``answer``) and the player's audio timeline of its segment
    ((monotonic arrival, duration, the chunk's ``text``) in arrival order), with :func:`.conversation.metrics`;
    ``spoken``: the chunks' texts joined (they tile what the node spoke, docs/dataflow.md, "What each chunk
    speaks"). ``answers``: how many ``segment_complete`` each segment got (one: the node joined its fragments)."""
    rows, problems = [], []
    for run in runs:
        sent = run["sent"]
        script = Script(tokens=[""] * len(sent), times=sent, sentences=ANSWERS[run["lang"]][:run["sentences"]],
                        ends=[sent[i] for i in run["ends"]])
        chunks = audio.get(run["segment"], [])
        arrivals = [(at - run["t0"], duration) for at, duration, _ in chunks]
        if run["answer"] != "completed":
            problems.append(f"segment {run['segment']} was answered {run['answer']!r}")
        if answers is not None and answers.get(run["segment"], 0) != 1:
            problems.append(f"segment {run['segment']} got {answers.get(run['segment'], 0)} answers, not one: a node "
                            "that does not join fragments (the in-process side feeds it sentences)")
        if not arrivals:
            problems.append(f"segment {run['segment']}: no audio arrived at the player")
            continue
        row = metrics(script, arrivals)
        row.update({k: run[k] for k in ("lang", "rate", "sentences", "segment")}, fed="fragments",
                   loadavg=run.get("loadavg"), spoken="".join(text for _, _, text in chunks))
        rows.append(row)
    return rows, problems


def player_main(result_file: str) -> int:
    """The player: every ``audio`` arrival (``time.monotonic()``, its ``duration`` and ``text``; silent ones
    skipped), the answers per segment and every ``run``; when its inputs close (the writer and the node have ended)
    it writes the figures to ``result_file``."""
    from dora import Node

    node = Node()
    audio: dict[int, list[tuple[float, float, str]]] = {}
    runs: list[dict] = []
    answers: dict[int, int] = {}
    while True:
        event = node.next()
        at = time.monotonic()
        if event is None or event["type"] == "STOP":
            break
        if event["type"] != "INPUT":
            continue
        md = event.get("metadata") or {}
        if event["id"] == "audio" and not md.get("silent") and "segment_id" in md:
            audio.setdefault(int(md["segment_id"]), []).append((at, float(md["duration"]), str(md.get("text", ""))))
        elif event["id"] == "segment_complete" and "segment_id" in md:
            answers[int(md["segment_id"])] = answers.get(int(md["segment_id"]), 0) + 1
        elif event["id"] == "run":
            runs.append(dict(json.loads(event["value"][0].as_py()), loadavg=os.getloadavg()[0]))
    rows, problems = figures(runs, audio, answers)
    Path(result_file).write_text(json.dumps({"rows": rows, "problems": problems}), encoding="utf-8")
    return 0


# ---- the orchestrator's side ---------------------------------------------------------------------------------------


def dora_cli() -> str | None:
    """The dora CLI: beside this interpreter (a venv's), else on ``PATH``."""
    here = Path(sys.executable).with_name("dora")
    return str(here) if here.exists() else shutil.which("dora")


def dataflow(python: str, plan: Path, result: Path, node_env: dict[str, str]) -> dict:
    """The dataflow: writer -> this package's node -> player (the writer also hears the node's answers). The node is
    the side's checkout (``PYTHONPATH`` in the environment of ``dora run``), the writer and the player this bench's
    package, as the in-process side runs this bench's script beside another checkout's package."""
    def wired(*sources):
        return {s.split("/")[1]: {"source": s, "queue_size": 1000} for s in sources}

    me = "-m dora_primespeech_mlx.bench.conversation_dora"
    bench = {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return {"nodes": [
        {"id": "writer", "path": python, "args": f"{me} writer {plan}",
         "inputs": wired("tts/segment_complete", "tts/status"), "outputs": ["text", "run", "done"], "env": bench},
        {"id": "tts", "path": python, "args": "-m dora_primespeech_mlx.node", "finish_grace_secs": FINISH_GRACE_S,
         "inputs": {"text": {"source": "writer/text", "queue_size": 1000}},
         "outputs": ["audio", "segment_complete", "status", "log"], "env": node_env},
        {"id": "player", "path": python, "args": f"{me} player {result}",
         "inputs": wired("tts/audio", "tts/segment_complete", "writer/run", "writer/done"), "env": bench},
    ]}


def run_dora_side(argv: list[str], env: dict[str, str], timeout: float, cotenant=None) -> tuple[list[dict], str | None]:
    """A side of this package (``argv``: its in-process command, :func:`.conversation.side_commands`) under
    ``dora run``, one dataflow per answer language; ``cotenant`` runs in each from the end of the warm-up to the
    dataflow's end. (rows as the in-process side's, with ``load``, ``cotenant_tps`` and ``mode``; why it failed)."""
    a = side_parser().parse_args(argv[2:])
    cli = dora_cli()
    if cli is None:
        return [], "not run: no dora CLI (pip install 'dora-primespeech-mlx[dora]')"
    md, voice, language = voice_dir(a.models, a.tiny)
    try:
        langs = tiny_langs(a.langs.split(","), language) if a.tiny else a.langs.split(",")
        base = side_settings(md, voice, a.threads, a.split, dict(kv.split("=", 1) for kv in a.set))
        run_env = dict(env) if "ZENOH_CONFIG" in env else {"DORA_ZENOH_CONFIG_OVERLAY": str(ZENOH_OVERLAY), **env}
        rows: list[dict] = []
        for lang in langs:
            plan = {"lang": lang, "rates": a.rates.split(","), "sentences": a.sentences, "runs": a.runs}
            got, problem = run_flow(cli, plan, {**base, "TEXT_LANG": lang}, run_env, timeout, cotenant)
            for r in got:
                r.update(threads=a.threads, split=a.split, mode=MODE)
            rows += got
            if problem:
                return rows, problem
        return rows, None
    finally:
        remove_model_dirs()


def run_flow(cli: str, plan: dict, node_env: dict[str, str], env: dict[str, str], timeout: float,
             cotenant=None) -> tuple[list[dict], str | None]:
    """One ``dora run`` in a temporary folder (removed after): start it, wait for the writer's ``warm`` file, start
    the co-tenant, write ``go``, wait for the dataflow's end, stop the co-tenant, read the player's figures."""
    work = Path(tempfile.mkdtemp(prefix="conversation-dora-"))
    plan = {**plan, "warm": str(work / "warm"), "go": str(work / "go")}
    (work / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    result = work / "result.json"
    flow = work / "dataflow.yaml"
    flow.write_text(yaml.safe_dump(dataflow(sys.executable, work / "plan.json", result, node_env),
                                   allow_unicode=True), encoding="utf-8")
    log = open(work / "dora.log", "w+", encoding="utf-8")
    deadline = time.monotonic() + timeout
    running, figures_, problem = None, None, None
    proc = subprocess.Popen([cli, "run", str(flow)], cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # its own process group: dora, its daemon and the nodes
    try:
        while not Path(plan["warm"]).exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(POLL_S)
        if Path(plan["warm"]).exists():
            if cotenant is not None:
                running, problem = started(cotenant, env)
            if problem is None:
                Path(plan["go"]).write_text("go", encoding="utf-8")
                try:
                    proc.wait(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    problem = f"dora run did not end in {timeout:g} s"
        elif proc.poll() is None:
            problem = f"the warm-up did not end in {timeout:g} s"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if running is not None:
            try:
                figures_ = running.stop()
            except RuntimeError as exc:
                problem = problem or str(exc)
        log.seek(0)
        output = log.read()
        log.close()
        got = json.loads(result.read_text(encoding="utf-8")) if result.is_file() else None
        shutil.rmtree(work, ignore_errors=True)
    if problem is None and (proc.returncode or got is None):
        problem = f"dora run failed (exit {proc.returncode}): " + tail(output)
    rows = got["rows"] if got else []
    if problem is None and got and got["problems"]:
        problem = "; ".join(got["problems"])
    if problem is None and not rows:
        problem = "the player reported no run"
    for r in rows:
        r["load"] = cotenant.text if cotenant is not None else "idle"
        r["cotenant_tps"] = figures_["tokens_per_s"] if figures_ else None
        r["cotenant"] = figures_
    return rows, problem


def tail(output: str, n: int = 12) -> str:
    """The last lines of dora's output, without its Rust backtraces' lines (indented)."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip() and not ln.startswith((" ", "\t"))]
    return " | ".join(lines[-n:])


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("writer", "player"):
        print("usage: python -m dora_primespeech_mlx.bench.conversation_dora writer PLAN.json | player RESULT.json",
              file=sys.stderr)
        return 2
    return writer_main(argv[1]) if argv[0] == "writer" else player_main(argv[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
