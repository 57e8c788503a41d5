"""End to end in a real ``dora run`` (dora-rs-cli from the venv): the node form and the operator form
with a voice built from the fixture models, driven by nodes/text_source.py, recorded by nodes/wav_sink.py.

Each run loads the models once (seconds), so the scripts pack many cases into few runs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import string
import subprocess
import sys
import time
from pathlib import Path

import pytest
import soundfile as sf
import yaml
from conftest import REPO
from tiny_voice import VOICE, VOICE_2, checkpoint, e2e_case, make_model_dir, reference_wav, write_voice

from dora_primespeech_mlx.settings import ZENOH_OVERLAY

pytestmark = pytest.mark.dora

BIN = Path(sys.executable).parent
TEMPLATE = Path(__file__).with_name("dataflow-test.yaml")
NODE_FORM = """\
    path: dora-primespeech-mlx
    inputs:
      text:
        source: text_source/text
        queue_size: 1000
      control:
        source: text_source/control
        queue_size: 1000
    outputs: [audio, segment_complete, status, log]"""
OPERATOR_FORM = f"""\
    operator:
      python: {REPO}/dora_primespeech_mlx/node.py
      inputs:
        text:
          source: text_source/text
          queue_size: 1000
        control:
          source: text_source/control
          queue_size: 1000
        tick: dora/timer/millis/50
      outputs: [audio, segment_complete, status, log]"""


def _dora() -> str:
    exe = BIN / "dora"
    found = str(exe) if exe.exists() else shutil.which("dora")
    if not found:
        pytest.skip("dora CLI (dora-rs-cli) not installed")
    return found


def run_flow(tmp: Path, script: str, tts: str, **kw):
    """One ``dora run`` of the test template. No re-runs: a lost or duplicated answer fails the test. The
    template keeps every receiver of the answers clear of dora's documented drop condition (each input's
    ``queue_size`` covers a whole run's messages; the answers are recorded by a node that receives no
    large payloads)."""
    return _run_flow(tmp, script, tts, **kw)


def _run_flow(tmp: Path, script: str, tts: str, *, voice=VOICE, streaming=False, warmup=False,
              index_as_str=False, model_dir: Path | None = None, timeout=240):
    tmp.mkdir(parents=True, exist_ok=True)
    model_dir = model_dir if model_dir is not None else make_model_dir(tmp / "models")
    (tmp / "script.txt").write_text(script, encoding="utf-8")
    shared = REPO.parent / "shared"
    yaml_text = string.Template(TEMPLATE.read_text(encoding="utf-8")).substitute(
        repo=REPO, script=tmp / "script.txt", tts=tts, voice=voice, model_dir=model_dir,
        streaming=str(streaming).lower(), warmup=str(warmup).lower(), index_as_str=str(index_as_str).lower(),
        out=tmp / "out",
        nltk_data=os.environ.get("NLTK_DATA", shared / "nltk_data"),
        text_data=os.environ.get("PRIMESPEECH_TEXT_DATA", shared / "data" / "gpt-sovits-text"),
    )
    flow = tmp / "dataflow.yaml"
    flow.write_text(yaml_text, encoding="utf-8")
    return run_yaml(tmp, flow, timeout)


def run_yaml(tmp: Path, flow: Path, timeout=240):
    # the packaged Zenoh overlay for every node of the flow (dora 1.1 otherwise drops small messages behind large
    # ones: see dora_primespeech_mlx/zenoh-overlay.json5)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "DORA_ZENOH_CONFIG_OVERLAY": str(ZENOH_OVERLAY)}
    t0 = time.monotonic()
    proc = subprocess.Popen([_dora(), "run", str(flow)], cwd=tmp, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # dora, its daemon and the nodes it spawned
        output, _ = proc.communicate()
        pytest.fail(f"dora run did not finish in {timeout} s:\n{tail(output)}")
    elapsed = time.monotonic() - t0
    report_path = tmp / "out" / "report.json"
    report = json.loads(report_path.read_text(encoding="utf-8")) if report_path.exists() else None
    answers_path = tmp / "out" / "answers" / "report.json"
    if report is not None and answers_path.exists():
        # The flow's audio-free recorder (see tests/node/dataflow-test.yaml) is the record of the answers.
        answers = json.loads(answers_path.read_text(encoding="utf-8"))
        report["segments"], report["status"] = answers["segments"], answers["status"]
        for qid, info in answers["questions"].items():
            report["questions"].setdefault(qid, {}).update(
                segment_complete=info["segment_complete"], errors=info["errors"])
    return proc.returncode, report, output, elapsed


def tail(output: str, n: int = 80) -> str:
    """The end of dora's output without Rust backtrace lines."""
    lines = [ln for ln in output.splitlines() if ln.strip() and not ln.startswith("   ") and "DEBUG" not in ln]
    return "\n".join(lines[-n:])


def by_status(report, status):
    return [s for s in report["status"] if isinstance(s["body"], dict) and s["body"].get("status") == status]


def check_one_answer_per_text(report, output):
    """Every text the source sent got exactly one segment_complete (and nothing else did)."""
    segments = report["segments"]
    assert segments, tail(output)
    orphans = [s for s in segments if s["text"] is None]
    assert not orphans, f"segment_complete without a matching text: {orphans}"
    missing = [s for s in segments if s["outcome"] is None]
    assert not missing, f"texts without segment_complete: {missing}"
    return segments


def audio_of(report, seg):
    return [a for a in report["audio"] if str(a.get("question_id")) == seg["question_id"]
            and str(a.get("segment_index")) == str(seg["segment_index"])]


def test_node_form_end_to_end(tmp_path):
    models = make_model_dir(tmp_path / "models")
    own = models / "trained"  # per-request voices read only inside the model folder (PRIMESPEECH_REQUEST_PATHS)
    own.mkdir()
    gpt, sovits, ref = (Path(shutil.copy(p, own)) for p in (checkpoint("gpt"), checkpoint("sovits"), reference_wav()))
    prompt = e2e_case()["inputs"]["prompt_text"]
    trained = f"VOICE:TRAINED|{gpt}|{sovits}|{ref}|{prompt}|en|Hello | world."
    script = "\n".join([
        "!list_voices",
        "!stats",
        "Hello world, this is a small test.",
        '{"prompt": "Hi there, friend.", "speed": 1.2}',
        f"VOICE:{VOICE_2}|Hi there.",
        "",
        f"!change_voice:{VOICE_2}",
        "!change_voice:Nobody Here",
        "Hi there.",
        trained,
        "@raw 626164fffe",  # invalid UTF-8 in a UInt8Array
        "。。。！",
        '{"speed": 2}',
        "!stats",
        "!make_coffee",
        "",
        # long enough that the reset surely arrives while it is spoken (reset interrupts it between tokens)
        "& " + " ".join(f"Sentence number {n}, a small test." for n in range(1, 13)),
        "& Hi there.",
        "@wait synthesizing",
        "!reset",
    ]) + "\n"
    rc, report, output, elapsed = run_flow(tmp_path, script, NODE_FORM, warmup=True, index_as_str=True,
                                           model_dir=models)
    assert rc == 0, tail(output)
    assert report is not None, tail(output)
    segments = check_one_answer_per_text(report, output)
    outcomes = {(s["question_id"], s["text"]): s["outcome"] for s in segments}
    assert outcomes[("1", "Hello world, this is a small test.")] == "completed"
    assert outcomes[("1", '{"prompt": "Hi there, friend.", "speed": 1.2}')] == "completed"
    assert outcomes[("1", f"VOICE:{VOICE_2}|Hi there.")] == "completed"
    assert outcomes[("1", "")] == "skipped" and outcomes[("2", "")] == "skipped"  # the flushes
    assert outcomes[("2", "Hi there.")] == "completed"
    assert outcomes[("2", trained)] == "completed"
    assert outcomes[("2", "。。。！")] == "skipped"
    assert outcomes[("2", '{"speed": 2}')] == "error"
    assert [s for s in segments if s["text"].startswith("<")][0]["outcome"] == "error"  # raw bytes
    # reset while the worker synthesises: answered at once by the event loop, the spoken text cancelled.
    # The queued text was sent before the reset, so it is cancelled too: at the reset when it reached the node
    # first, on arrival when dora (which does not order events of different inputs) hands it over after the reset.
    long_seg, queued = [s for s in segments if s["question_id"] == "3" and s["text"]]
    reset = by_status(report, "reset")[0]
    assert long_seg["arrival"] < reset["arrival"]  # the cancelled texts are answered at once, then the reset
    assert long_seg["outcome"] == "error" and long_seg["metadata"]["error"] == "cancelled by reset"
    assert queued["outcome"] == "error" and queued["metadata"]["error"] == "cancelled by reset"
    assert reset["body"]["cancelled"] in (1, 2)  # 2 when the queued text had reached the node before the reset

    for seg in segments:
        chunks = audio_of(report, seg)
        if seg["outcome"] == "completed":
            assert len(chunks) == 1, seg  # batch mode: one audio message per text
            md = chunks[0]
            assert md["sample_rate"] == 32000 and md["duration"] > 0 and md["is_final"] is True
            # sent as str ("0", as the MaaS client does), forwarded as int (the players add 1 to it)
            assert md["segment_index"] == int(seg["segment_index"]) and isinstance(md["segment_index"], int)
            assert md["session_id"] == "demo" and md["value_type"].startswith("list<")
            assert md["samples"] == round(md["duration"] * 32000)
            assert seg["metadata"]["session_status"] in ("started", "ongoing")
        elif seg["metadata"].get("error_stage") == "reset":
            assert not chunks, seg
        else:  # SILENCE_ON_SKIP: one short silent audio message for a skipped or failed text
            assert len(chunks) == 1 and chunks[0]["silent"] is True and chunks[0]["is_final"] is True, seg
        if seg["outcome"] == "error":
            assert seg["metadata"]["session_status"] == "error" and seg["metadata"]["error"]
    voice_of = {seg["text"]: audio_of(report, seg)[0]["voice"] for seg in segments if seg["outcome"] == "completed"}
    assert voice_of["Hello world, this is a small test."] == VOICE
    assert voice_of[f"VOICE:{VOICE_2}|Hi there."] == VOICE_2
    assert voice_of["Hi there."] == VOICE_2  # after change_voice
    assert voice_of[trained] == "TRAINED"

    assert by_status(report, "ready")
    voices = by_status(report, "voices")[0]["body"]
    assert {VOICE, VOICE_2} <= {v["name"] for v in voices["voices"] if v["installed"]}
    stats = by_status(report, "stats")
    assert len(stats) == 2 and stats[1]["body"]["node_counts"]["texts"] >= 5  # answered at once, not queued
    assert by_status(report, "voice_changed")[0]["body"]["voice"] == VOICE_2
    errors = [s["body"] for s in by_status(report, "error")]
    assert any("Nobody Here" in e["error"] for e in errors)
    assert any("unknown control command" in e["error"] for e in errors)
    assert any("UTF-8" in e["error"] for e in errors)
    levels = {entry["level"] for entry in report["log"] if isinstance(entry, dict)}
    assert {"INFO", "ERROR"} <= levels
    # nothing of the cancelled texts (a spoken or skipped one has its audio, a silent one for a skipped flush)
    assert report["questions"]["3"]["chunks"] == sum(
        1 for s in segments if s["question_id"] == "3" and s["metadata"].get("error_stage") != "reset")
    for qid in ("1", "2"):
        q = report["questions"][qid]
        data, rate = sf.read(q["wav"], dtype="int16")
        assert rate == 32000 and len(data) == pytest.approx(q["duration"] * 32000, abs=2)
        assert sf.info(q["wav"]).subtype == "PCM_16"
    print(f"node form: dora run took {elapsed:.1f} s")


def test_a_text_the_voice_cannot_read_is_skipped_with_its_reason(tmp_path):
    """An English voice and a Chinese text under a real ``dora run``: ``skipped``, and the reason (with what to do)
    on segment_complete, on the status that follows ``synthesizing`` and in one WARNING on ``log``."""
    models = make_model_dir(tmp_path / "models")
    write_voice(models, "Tiny English", language="en")
    chinese = "你好，今天天气很好。"
    rc, report, output, _ = run_flow(tmp_path, f"{chinese}\n", NODE_FORM, voice="Tiny English", model_dir=models)
    assert rc == 0, tail(output)
    assert report is not None, tail(output)
    (seg,) = [s for s in check_one_answer_per_text(report, output) if s["text"] == chinese]  # (and the flush)
    assert seg["outcome"] == "skipped"
    reason = seg["metadata"]["reason"]
    assert "nothing speakable as 'en', the voice's language" in reason and "auto" in reason
    statuses = [s["body"] for s in report["status"] if s["metadata"].get("question_id") == seg["question_id"]
                and s["metadata"].get("segment_index") == seg["metadata"]["segment_index"]]
    assert [s["status"] for s in statuses] == ["synthesizing", "skipped"], statuses
    assert statuses[1]["reason"] == reason
    warnings = [e for e in report["log"] if isinstance(e, dict) and e["level"] == "WARNING" and reason in e["message"]]
    assert len(warnings) == 1, report["log"]
    assert f"WARNING text #1 (question_id={seg['question_id']}" in output  # on the node's stderr too


@pytest.mark.slow
def test_operator_form_streaming_and_reset(tmp_path):
    script = "\n".join([
        # long enough that the reset surely arrives while it is spoken (streaming stops between tokens)
        "& " + " ".join(f"Sentence number {n}, a small test." for n in range(1, 31)),
        "& Hello world, this is a small test.",
        "@wait audio",
        "!reset",
        "Hi there.",
    ]) + "\n"
    rc, report, output, elapsed = run_flow(tmp_path, script, OPERATOR_FORM, streaming=True)
    assert rc == 0, tail(output)
    assert report is not None, tail(output)
    segments = check_one_answer_per_text(report, output)
    long_seg, queued, after, flush = segments
    assert long_seg["outcome"] == "error" and long_seg["metadata"]["error"] == "cancelled by reset"
    assert queued["outcome"] == "error" and queued["metadata"]["error_stage"] == "reset"
    assert after["outcome"] == "completed" and flush["outcome"] == "skipped"
    assert by_status(report, "reset")[0]["body"]["cancelled"] == 2
    long_chunks = audio_of(report, long_seg)
    assert long_chunks and not any(c["is_final"] for c in long_chunks)
    assert not audio_of(report, queued)
    chunks = audio_of(report, after)
    assert [c["chunk_index"] for c in chunks] == list(range(len(chunks)))
    assert [c["fragment_num"] for c in chunks] == [i + 1 for i in range(len(chunks))]
    assert chunks[-1]["is_final"] and all(c["is_streaming"] for c in chunks)
    assert all(c["segment_index"] == after["segment_index"] and isinstance(c["segment_index"], int) for c in chunks)
    print(f"operator form: dora run took {elapsed:.1f} s")


def test_missing_voice_files_fail_fast_with_instructions(tmp_path):
    empty = tmp_path / "empty-models"
    empty.mkdir()
    rc, report, output, elapsed = run_flow(tmp_path, "Hello.\n", NODE_FORM, voice="Doubao", model_dir=empty,
                                           timeout=120)
    assert rc != 0
    assert "primespeech-mlx download" in output and "not installed" in output
    assert elapsed < 60
    if report is not None:  # the error also went out on status before the node exited
        init = [s["body"] for s in by_status(report, "error")]
        assert init and init[0]["error_stage"] == "init"


@pytest.mark.slow
def test_orchestrator_streams_switches_voice_and_barges_in(tmp_path):
    """examples/dataflow-orchestrator.yaml with the tiny voices: LLM-style streaming (no waiting),
    reset at the first audio of answer 1, change_voice, answer 2 in the new voice."""
    model_dir = make_model_dir(tmp_path / "models")
    flow = yaml.safe_load((REPO / "examples" / "dataflow-orchestrator.yaml").read_text(encoding="utf-8"))
    shared = REPO.parent / "shared"
    for node in flow["nodes"]:
        if node.get("path", "").endswith(".py"):
            node["path"] = str(REPO / "nodes" / Path(node["path"]).name)
        if node["id"] == "orchestrator":
            node["env"] = {"VOICE_2": VOICE_2, "WAIT_TIMEOUT": "150", "ANSWER_1": (
                "One small test.|Two small tests.|Three small tests.|Four small tests."),
                "ANSWER_2": "Hi there.|Hello world, this is a small test."}
        if node["id"] == "primespeech":
            node["env"].update(VOICE_NAME=VOICE, PRIMESPEECH_MODEL_DIR=str(model_dir), GPTSVITS_WARMUP="false",
                               NLTK_DATA=os.environ.get("NLTK_DATA", str(shared / "nltk_data")),
                               PRIMESPEECH_TEXT_DATA=os.environ.get(
                                   "PRIMESPEECH_TEXT_DATA", str(shared / "data" / "gpt-sovits-text")))
        if node["id"] == "wav_sink":
            node["env"] = {"OUTPUT_DIR": str(tmp_path / "out")}
    sink = next(n for n in flow["nodes"] if n["id"] == "wav_sink")
    flow["nodes"].append({  # the audio-free recorder of the answers, as in tests/node/dataflow-test.yaml
        "id": "recorder", "path": sink["path"], "env": {"OUTPUT_DIR": str(tmp_path / "out" / "answers")},
        "inputs": {k: v for k, v in sink["inputs"].items() if k not in ("audio", "log")},
    })
    path = tmp_path / "orchestrator.yaml"
    path.write_text(yaml.safe_dump(flow, allow_unicode=True), encoding="utf-8")
    rc, report, output, elapsed = run_yaml(tmp_path, path)  # no re-runs: a lost answer fails
    assert rc == 0, tail(output)
    segments = check_one_answer_per_text(report, output)
    answer1 = [s for s in segments if s["question_id"] == "1"]
    answer2 = [s for s in segments if s["question_id"] == "2"]
    assert answer1[0]["outcome"] == "error" and answer1[0]["metadata"]["error"] == "cancelled by reset"
    assert all(s["outcome"] == "completed" or s["metadata"]["error"] == "cancelled by reset" for s in answer1)
    cancelled = sum(s["outcome"] == "error" for s in answer1)
    assert by_status(report, "reset")[0]["body"]["cancelled"] == cancelled
    assert len(answer2) == 2 and all(s["outcome"] == "completed" for s in answer2)
    for seg in answer2:
        chunks = audio_of(report, seg)
        assert chunks and all(c["voice"] == VOICE_2 and c["is_streaming"] for c in chunks)
        assert [c["fragment_num"] for c in chunks] == list(range(1, len(chunks) + 1)) and chunks[-1]["is_final"]
    assert by_status(report, "voice_changed")[0]["body"]["voice"] == VOICE_2
    assert len(by_status(report, "stats")) == 2 and by_status(report, "voices")
    # the orchestrator keeps what the listener heard of answer 1 (the cancelled texts' reports) and prints it
    (heard,) = [ln for ln in output.splitlines() if "answer 1 was cut by the barge-in" in ln]
    whole = sum(s["outcome"] == "completed" for s in answer1)
    assert f"the listener heard {whole} of 4 sentence(s) whole" in heard, heard
    print(f"orchestrator: dora run took {elapsed:.1f} s")
