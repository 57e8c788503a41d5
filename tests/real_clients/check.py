"""Real-client check: the client dataflows of issue 13 with only the TTS node swapped for this package.

    python tests/real_clients/check.py --lovemma-dora DIR --studio DIR --mofa-fm DIR --dora-pyaudio DIR \
        [--runs 3] [--flows mac-aec-maas,mac-aec-qwen3,conference,dora-pyaudio] [--set FLOW:NAME=VALUE]

Each folder is a checkout (or extracted archive) of the client repository: Lovemma/dora
(examples/mac-aec-chat, node-hub/dora-text-segmenter), mofa-org/studio @8e85f27 (apps/mofa-fm/dataflow,
node-hub/dora-text-segmenter, libs/dora-common), mofa-org/mofa-fm @3024825 (examples/conference) and the
unpacked dora-pyaudio 0.5.0 wheel (``pip download dora-pyaudio==0.5.0`` + unzip). Nothing is installed:
the real Python nodes run from those folders through PYTHONPATH.

For each flow the original YAML is rendered with: the TTS node(s) running ``dora-primespeech-mlx`` with the
fixture voice (tests/node/tiny_voice.py: random weights, speaks English); the LLM/ASR/microphone (and the
Rust conference bridges/controller) replaced by tests/real_clients/standins.py; the real players and
viewer run unmodified as static nodes, with ``sounddevice``/``pyaudio`` resolved to a null sink
(tests/real_clients/shim) that counts what the player writes to the device; UI-only dynamic nodes of the
MoFA Studio app dropped; two probes added. Then a real ``dora run`` per run, with a time limit.

Per run it reports: segments sent to the TTS, ``segment_complete`` answers, audio messages, seconds of sound
the real player wrote to the device, player/viewer errors, and stalls (text the LLM produced for an answer
that was not interrupted and never reached the TTS, or a segment without its answer). Not part of
.ci/run: CI has no copy of those repositories.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
BIN = Path(sys.executable).parent
STANDINS = HERE / "standins.py"
SHIM = HERE / "shim"

# What the LLM stand-ins answer. English only: the fixture voice's BERT cannot feed its GPT, so only
# English (zero BERT features) can be spoken; ``😊！`` is the text the TTS has nothing to speak in.
ANSWER_1 = ["Hello there.", " I can help with that.", " 😊！", " The weather today is sunny and warm.",
            " We could go for a walk in the park."]
ANSWER_2 = ["Let me think about it.", " There are three good options.", " The first one is the cheapest.",
            " The second one is the fastest.", " The third one is the nicest of all."]
ANSWER_3 = ["Sure, stopping now.", " Ask me anything else.", " 😊！"]
MAC_AEC_SCRIPT = {"tts_nodes": 1, "questions": [
    {"question_id": 482913, "transcription": "What should we do today?", "answer": ANSWER_1},
    {"question_id": 730164, "transcription": "Which one should I buy?", "answer": ANSWER_2,
     "barge_in_after_s": 1.0},
    {"question_id": 155820, "transcription": "Stop, another question.", "answer": ANSWER_3},
]}
CONFERENCE_SCRIPT = {"tts_nodes": 3, "question_id": "1", "turns": [
    {"participant": "tutor", "prompt": "Open the study session.",
     "answer": ["Welcome to the study session.", " Today we look at photosynthesis.", " 😊！",
                " Plants turn light into sugar.", " Who wants to start?"]},
    {"participant": "student1", "prompt": "Your turn.",
     "answer": ["I can start.", " Light hits the leaves, and water is split.", " Oxygen is released."]},
    {"participant": "student2", "prompt": "Your turn.",
     "answer": ["I will add one thing.", " The sugar is made in the dark reactions."]},
]}
# dora-hub LLM nodes send a whole answer as one text; dora-pyaudio plays only the newest audio message (it
# drops the unplayed rest of the previous one), so one audio message per answer is what it can play whole.
PYAUDIO_SCRIPT = {"tts_nodes": 1, "questions": [
    {"question_id": 1, "answer": ["Hello from the MLX node. This plays on dora-pyaudio. 😊！ It is the first answer."]},
    {"question_id": 2, "answer": ["😊！"]},
    {"question_id": 3, "answer": ["The second answer is short."]},
]}
# The same sentences one text at a time, each sent on the previous one's segment_complete (a MoFA-style
# segmenter in front of dora-pyaudio): shows that dora-pyaudio cuts each audio message short when the next
# one arrives before it has been played.
PYAUDIO_SENTENCES_SCRIPT = {"tts_nodes": 1, "questions": [
    {"question_id": 1, "answer": ["Hello from the MLX node.", "This plays on dora-pyaudio.", "😊！",
                                  "It is the first answer."]},
]}


DEMO_ONLY = {"dora-pyaudio-sentences"}  # run only when named in --flows: it shows a limit of dora-pyaudio


def flows(args) -> dict:
    lov = Path(args.lovemma_dora) if args.lovemma_dora else None
    studio = Path(args.studio) if args.studio else None
    mofa = Path(args.mofa_fm) if args.mofa_fm else None
    pyaudio = Path(args.dora_pyaudio) if args.dora_pyaudio else None
    out: dict = {}
    if lov:
        base = lov / "examples" / "mac-aec-chat"
        common = {
            "tts": ["primespeech"],
            "launch": {"text-segmenter": (lov / "node-hub" / "dora-text-segmenter", "dora_text_segmenter.main")},
            "players": {"audio-player": (base / "audio_player.py", []), "viewer": (base / "viewer.py", [])},
            "script": MAC_AEC_SCRIPT,
            "probe": {"segments": ["text-segmenter/text_segment"], "tts_status": ["primespeech/status"],
                      "complete": ["primespeech/segment_complete"], "tts_log": ["primespeech/log"]},
            "audio": ["primespeech/audio"],
        }
        out["mac-aec-maas"] = {**common, "yaml": base / "voice-chat-with-aec-maas.yml",
                               "replace": {"mac-aec": {"STANDIN_ROLE": "mic"}, "asr": {"STANDIN_ROLE": "asr"},
                                           "maas-client": {"STANDIN_ROLE": "llm", "LLM_KIND": "maas"}},
                               "probe": {**common["probe"], "llm": ["maas-client/text"]}}
        out["mac-aec-qwen3"] = {**common, "yaml": base / "voice-chat-with-aec.yml",
                                "replace": {"mac-aec": {"STANDIN_ROLE": "mic"}, "asr": {"STANDIN_ROLE": "asr"},
                                            "qwen3-llm": {"STANDIN_ROLE": "llm", "LLM_KIND": "qwen3"}},
                                "probe": {**common["probe"], "llm": ["qwen3-llm/text"]}}
    if studio and mofa:
        tts = ["primespeech-student1", "primespeech-student2", "primespeech-tutor"]
        out["conference"] = {
            "yaml": studio / "apps" / "mofa-fm" / "dataflow" / "voice-chat.yml",
            "tts": tts,
            "launch": {"multi-text-segmenter": (studio / "node-hub" / "dora-text-segmenter",
                                                "dora_text_segmenter.main")},
            "replace": {
                **{p: {"STANDIN_ROLE": "llm", "LLM_KIND": "maas", "PARTICIPANT": p}
                   for p in ("student1", "student2", "tutor")},
                **{f"bridge-to-{p}": {"STANDIN_ROLE": "bridge"} for p in ("student1", "student2", "tutor")},
                "conference-controller": {"STANDIN_ROLE": "controller"},
                "mofa-mic-input": {"STANDIN_ROLE": "idle"}, "asr": {"STANDIN_ROLE": "idle"},
            },
            "drop": ["mofa-prompt-input", "mofa-system-log"],  # UI widgets of the MoFA Studio app (Rust)
            "players": {"mofa-audio-player": (mofa / "examples" / "conference" / "audio_player.py",
                                              [studio / "libs" / "dora-common"])},
            "script": CONFERENCE_SCRIPT,
            "probe": {"segments": [f"multi-text-segmenter/text_segment_{p}" for p in ("student1", "student2",
                                                                                        "tutor")],
                      "tts_status": [f"{t}/status" for t in tts], "complete": [f"{t}/segment_complete" for t in tts],
                      "llm": ["student1/text", "student2/text", "tutor/text"],
                      "player": ["mofa-audio-player/audio_complete"], "tts_log": [f"{t}/log" for t in tts]},
            "audio": [f"{t}/audio" for t in tts],
        }
    if pyaudio:
        for name, plan in (("dora-pyaudio", PYAUDIO_SCRIPT), ("dora-pyaudio-sentences", PYAUDIO_SENTENCES_SCRIPT)):
            out[name] = {"yaml": None, "tts": ["primespeech"], "script": plan, "pyaudio_dir": pyaudio,
                         "settings": {"AUDIO_FORMAT": "flat"},
                         "probe": {"segments": ["feeder/text"], "tts_status": ["primespeech/status"],
                                   "complete": ["primespeech/segment_complete"], "tts_log": ["primespeech/log"]},
                         "audio": ["primespeech/audio"]}
    return out


def pyaudio_yaml(spec: dict) -> dict:
    """dora-hub has no primespeech flow: a segmenter-like feeder -> the TTS -> dora-pyaudio, wired as its
    README shows (``audio`` input, ``sample_rate`` in the metadata)."""
    return {"nodes": [
        {"id": "feeder", "path": "standin", "inputs": {"segment_complete": "primespeech/segment_complete"},
         "outputs": ["text"]},
        {"id": "primespeech", "path": "dora-primespeech-mlx", "inputs": {"text": "feeder/text"},
         "outputs": ["audio", "segment_complete", "status", "log"], "env": {}},
        {"id": "dora-pyaudio", "path": "dora-pyaudio", "inputs": {"audio": "primespeech/audio"}},
    ]}


def _source_node(source) -> str:
    src = source["source"] if isinstance(source, dict) else source
    return str(src).split("/", 1)[0]


def render(name: str, spec: dict, work: Path, model_dir: Path, settings: dict) -> Path:
    data = pyaudio_yaml(spec) if spec["yaml"] is None else yaml.safe_load(Path(spec["yaml"]).read_text("utf-8"))
    dropped = set(spec.get("drop", []))
    nodes = [n for n in data["nodes"] if n["id"] not in dropped]
    shared = REPO.parent / "shared"
    script_path = work / "script.json"
    script_path.write_text(json.dumps(spec["script"], ensure_ascii=False, indent=1), encoding="utf-8")
    base_env = {"CHECK_OUT": str(work), "CHECK_SCRIPT": str(script_path)}
    for node in nodes:
        nid = node["id"]
        inputs = node.get("inputs") or {}
        node["inputs"] = {k: v for k, v in inputs.items() if _source_node(v) not in dropped}
        if not node["inputs"]:
            node.pop("inputs")
        node.pop("build", None)
        if nid in spec["tts"]:
            env = dict(node.get("env") or {})
            for key in ("TEXT_LANG", "PROMPT_LANG", "PROMPT_TEXT"):  # the fixture voice speaks English only
                env.pop(key, None)
            env.update(VOICE_NAME="Tiny", PRIMESPEECH_MODEL_DIR=str(model_dir), PRIMESPEECH_AUTO_DOWNLOAD="false",
                       NLTK_DATA=os.environ.get("NLTK_DATA", str(shared / "nltk_data")),
                       PRIMESPEECH_TEXT_DATA=os.environ.get("PRIMESPEECH_TEXT_DATA",
                                                            str(shared / "data" / "gpt-sovits-text")))
            env["PYTHONPATH"] = str(REPO)  # this checkout's package, whatever the venv has installed
            env.update(spec.get("settings", {}))
            env.update(settings)
            node["env"] = {k: str(v) for k, v in env.items()}
            node["path"] = str(BIN / "dora-primespeech-mlx")
            if "status" not in node.setdefault("outputs", []):  # the probe waits for its `ready` status
                node["outputs"].append("status")
        elif nid in spec.get("replace", {}) or nid == "feeder":
            node["path"] = str(STANDINS)
            node["env"] = {**base_env, **spec.get("replace", {}).get(nid, {"STANDIN_ROLE": "feeder"})}
        elif nid in spec.get("players", {}):
            script, extra = spec["players"][nid]
            node["path"] = str(script)
            node["env"] = {**{k: str(v) for k, v in (node.get("env") or {}).items()},
                           "PYTHONPATH": os.pathsep.join([str(SHIM), *map(str, extra)]),
                           "NULL_SINK_REPORT": str(work / f"sink-{nid}.json")}
        elif nid in spec.get("launch", {}):
            folder, module = spec["launch"][nid]
            node["path"] = str(_launcher(work, nid, folder, module))
        elif nid == "dora-pyaudio":
            node["path"] = str(_launcher(work, nid, spec["pyaudio_dir"], "dora_pyaudio.main"))
            node["env"] = {"PYTHONPATH": str(SHIM), "NULL_SINK_REPORT": str(work / f"sink-{nid}.json")}
        elif node.get("path") == "dynamic":
            raise SystemExit(f"{name}: dynamic node {nid!r} has no stand-in or player")
    probe_inputs = {}
    for group, sources in spec["probe"].items():
        for src in sources:
            probe_inputs[f"{group}_{src.replace('/', '__')}"] = {"source": src, "queue_size": 1000}
    nodes.append({"id": "check-probe", "path": str(STANDINS), "inputs": probe_inputs,
                  "env": {**base_env, "STANDIN_ROLE": "probe", "PROBE_NAME": "probe"}})
    nodes.append({"id": "check-probe-audio", "path": str(STANDINS),
                  "inputs": {f"audio_{s.replace('/', '__')}": {"source": s, "queue_size": 1000}
                             for s in spec["audio"]},
                  "env": {**base_env, "STANDIN_ROLE": "probe", "PROBE_NAME": "probe-audio"}})
    data["nodes"] = nodes
    flow = work / f"{name}.yml"
    flow.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return flow


def _launcher(work: Path, nid: str, folder: Path, module: str) -> Path:
    """Run a packaged node's entry point from its source folder (no pip install into this venv)."""
    path = work / f"launch_{nid.replace('-', '_')}.py"
    path.write_text(f"import sys\nsys.path.insert(0, {str(folder)!r})\nfrom {module} import main\nmain()\n",
                    encoding="utf-8")
    return path


def run_once(name: str, spec: dict, work: Path, model_dir: Path, settings: dict, limit: float) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    flow = render(name, spec, work, model_dir, settings)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "RUST_BACKTRACE": "0",
           "PYTHONUNBUFFERED": "1"}
    log = open(work / "dora.log", "w", encoding="utf-8")  # noqa: SIM115
    t0 = time.monotonic()
    proc = subprocess.Popen([str(BIN / "dora"), "run", str(flow)], cwd=work, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    timed_out = False
    while proc.poll() is None:
        driver = _read_json(work / "driver.json")
        if driver.get("finished"):
            break
        if time.monotonic() - t0 > limit:
            timed_out = True
            break
        time.sleep(0.5)
    time.sleep(1.0)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)  # dora stops the dataflow (STOP to every node)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log.close()
    elapsed = time.monotonic() - t0
    report = analyse(spec, work)
    report.update(run_s=round(elapsed, 1), timed_out=timed_out, dora_rc=proc.returncode)
    return report


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def _letters(text: str) -> str:
    return "".join(c for c in text if c.isalnum()).lower()


ERROR_PATTERNS = [r"can only concatenate str", r"ArrowInvalid", r"len\(\) of unsized object", r"\[Error\]",
                  r"Traceback", r"failed: exited with", r"ERROR processing", r"Error processing"]


def analyse(spec: dict, work: Path) -> dict:
    small = _records(work / "probe.jsonl")
    audio = _records(work / "probe-audio.jsonl")
    driver = _read_json(work / "driver.json")
    sink = {p.name: _read_json(p) for p in work.glob("sink-*.json")}
    segs = [r for r in small if r["input"].startswith("segments_")]
    done = [r for r in small if r["input"].startswith("complete_")]
    llm = [r for r in small if r["input"].startswith("llm_")]
    interrupted = {str(q["question_id"]) for q in driver.get("questions", []) if q.get("interrupted")}

    def qid(rec) -> str:
        return str(rec["metadata"].get("question_id"))

    # Stalls: text the LLM produced (for answers that were not interrupted) that never reached the TTS.
    produced, sent = {}, {}
    for r in llm:
        key = (qid(r), r["input"])
        produced[key] = produced.get(key, "") + _letters("".join(x or "" for x in r.get("value", [])))
    for r in segs:
        sent[qid(r)] = sent.get(qid(r), "") + _letters("".join(x or "" for x in r.get("value", [])))
    stalls = []
    for (q, src), letters in produced.items():
        if q in interrupted or not letters:
            continue
        if letters not in sent.get(q, "") and not _contained_in_order(letters, sent.get(q, "")):
            stalls.append(f"question {q} ({src.split('__')[0][4:]}): LLM text not all sent to the TTS")
    # The segmenters here keep one segment in flight and send the next only after the answer to the previous
    # one (segment_complete, or the player's audio_complete in conference mode), so a segment followed by a
    # later one was answered even when the probe did not see its segment_complete (dora 1.1 now and then loses
    # a small message silently; README, Queues). The last segment without any answer after it is a stall.
    last_seg = max((r["t"] for r in segs), default=None)
    if last_seg is not None and not any(r["t"] >= last_seg for r in done):
        stalls.append("the last segment sent got no segment_complete")
    probe_missed = max(0, len(segs) - len(done) - (1 if stalls and "segment_complete" in stalls[-1] else 0))
    if driver and not driver.get("finished"):
        stalls.append("the driver did not finish (time limit)")
    outcomes = {}
    for r in done:
        for v in r.get("value", []):
            outcomes[v] = outcomes.get(v, 0) + 1
    index_types = sorted({r["metadata_types"].get("segment_index", "-") for r in done + audio})
    log_text = (work / "dora.log").read_text(encoding="utf-8", errors="replace") if (work / "dora.log").exists() else ""
    errors = {}
    for pat in ERROR_PATTERNS:
        n = len(re.findall(pat, log_text))
        if n:
            errors[pat.replace("\\", "")] = n
    report = {
        "segments_sent": len(segs),
        "completions": len(done),
        "completions_missed_by_probe": probe_missed,
        "outcomes": outcomes,
        "audio_messages": len(audio),
        "silent_audio": sum(1 for r in audio if r["metadata"].get("silent")),
        "audio_s_sent": round(sum(float(r["metadata"].get("duration", 0) or 0) for r in audio), 2),
        "voiced_s_sent": round(sum((r.get("nonzero") or 0) / float(r["metadata"].get("sample_rate") or 32000)
                                   for r in audio), 2),
        "played_s": round(sum(s.get("voiced_seconds", 0.0) for s in sink.values()), 2),
        "segment_index_types": index_types,
        "interrupted": sorted(interrupted),
        "stalls": stalls,
        "errors_in_output": errors,
    }
    # Sound the TTS sent that the device never played (answers that were not interrupted only).
    report["not_played_s"] = (round(max(0.0, report["voiced_s_sent"] - report["played_s"]), 2)
                              if not interrupted else None)
    return report


def _contained_in_order(needle: str, hay: str) -> bool:
    """Every character of ``needle`` appears in ``hay`` in order (segmenters merge and split texts)."""
    it = iter(hay)
    return all(c in it for c in needle)


def print_table(results: dict) -> bool:
    print("\nflow                    run  segments  completions  audio msgs  sound sent s  played s  stalls  errors")
    ok = True
    for name, reps in results.items():
        for i, r in enumerate(reps, 1):
            errs = ", ".join(f"{k}×{v}" for k, v in r["errors_in_output"].items()) or "-"
            print(f"{name:23} {i:3}  {r['segments_sent']:8}  {r['completions']:11}  {r['audio_messages']:10}  "
                  f"{r['voiced_s_sent']:12.2f}  {r['played_s']:8.2f}  {len(r['stalls']):6}  {errs}")
            ok &= (not r["stalls"] and not r["errors_in_output"] and r["played_s"] > 0
                   and (r["not_played_s"] or 0) <= 0.05)
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lovemma-dora", help="Lovemma/dora checkout (examples/mac-aec-chat, node-hub)")
    ap.add_argument("--studio", help="mofa-org/studio checkout @8e85f27")
    ap.add_argument("--mofa-fm", help="mofa-org/mofa-fm checkout @3024825")
    ap.add_argument("--dora-pyaudio", help="unpacked dora-pyaudio 0.5.0 wheel (folder holding dora_pyaudio/)")
    ap.add_argument("--flows", default="", help="comma-separated subset (default: every flow whose repos are given)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--limit", type=float, default=240.0, help="seconds per run")
    ap.add_argument("--set", action="append", default=[], metavar="FLOW:NAME=VALUE",
                    help="a TTS setting for one flow (FLOW may be '*'), e.g. dora-pyaudio:AUDIO_FORMAT=list")
    ap.add_argument("--work", help="folder for the rendered flows and records (default: a temp folder)")
    ap.add_argument("--json", help="write the whole report here")
    ap.add_argument("--reanalyse", metavar="WORK", help="only report again on the records of an earlier --work")
    args = ap.parse_args(argv)
    if args.reanalyse:
        results = {}
        for run_dir in sorted(Path(args.reanalyse).glob("*/run*")):
            rep = analyse({}, run_dir)
            results.setdefault(run_dir.parent.name, []).append(rep)
            print(f"{run_dir.parent.name} {run_dir.name}: " + json.dumps(rep, ensure_ascii=False))
        return 0 if print_table(results) else 1

    sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "node")]
    from tiny_voice import make_model_dir  # noqa: PLC0415  (fixture voice, as the node tests build it)

    available = flows(args)
    wanted = [f for f in args.flows.split(",") if f] or [f for f in available if f not in DEMO_ONLY]
    missing = [f for f in wanted if f not in available]
    if missing:
        ap.error(f"no folders given for {missing} (available: {sorted(available)})")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="real-clients-"))
    model_dir = make_model_dir(work / "models")
    results: dict = {}
    for name in wanted:
        settings = {}
        for item in args.set:
            flow, _, kv = item.partition(":")
            key, _, value = kv.partition("=")
            if flow in (name, "*"):
                settings[key] = value
        results[name] = []
        for i in range(args.runs):
            run_dir = work / name / f"run{i + 1}"
            shutil.rmtree(run_dir, ignore_errors=True)
            rep = run_once(name, available[name], run_dir, model_dir, settings, args.limit)
            rep["settings"] = {**available[name].get("settings", {}), **settings}
            results[name].append(rep)
            print(f"{name} run {i + 1}: " + json.dumps(rep, ensure_ascii=False), flush=True)
    ok = print_table(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, ensure_ascii=False, indent=1), encoding="utf-8")
    print(f"\nrecords in {work}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
