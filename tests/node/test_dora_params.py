"""Runtime parameters under a real coordinator and daemon: ``dora up``, ``dora start --detach``, ``dora param set``
(the node receives PARAM_UPDATE events), ``dora param list``, ``dora stop``, ``dora down``. The voice set as a
parameter speaks the next text; the answers come on ``status`` as for the controls."""

from __future__ import annotations

import json
import os
import socket
import string
import subprocess
import time
from pathlib import Path

import pytest
from conftest import REPO
from test_dora import BIN, NODE_FORM, TEMPLATE, _dora, by_status, check_one_answer_per_text
from tiny_voice import VOICE, VOICE_2, make_model_dir

from dora_primespeech_mlx.settings import ZENOH_OVERLAY

pytestmark = pytest.mark.dora


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(predicate, timeout: float, what: str, diagnose=lambda: ""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{diagnose()}")


def _node_log(tmp: Path) -> str:
    """The TTS node's stdout/stderr as the daemon records them (out/<dataflow uuid>/log_primespeech.jsonl)."""
    lines = []
    for path in (tmp / "out").glob("*/log_primespeech.jsonl"):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                lines.append(json.loads(line).get("msg", ""))
            except ValueError:
                continue
    return "\n".join(lines)


def test_dora_param_set_changes_the_voice_of_the_next_text(tmp_path):
    models = make_model_dir(tmp_path / "models")
    shared = REPO.parent / "shared"
    # the second text waits until the voice parameter has been answered (voice_changed)
    (tmp_path / "script.txt").write_text("Hi there.\n@wait voice_changed\nHi there.\n", encoding="utf-8")
    flow = tmp_path / "dataflow.yaml"
    flow.write_text(string.Template(TEMPLATE.read_text(encoding="utf-8")).substitute(
        repo=REPO, script=tmp_path / "script.txt", tts=NODE_FORM, voice=VOICE, model_dir=models, streaming="false",
        warmup="false", index_as_str="false", out=tmp_path / "out",
        nltk_data=os.environ.get("NLTK_DATA", shared / "nltk_data"),
        text_data=os.environ.get("PRIMESPEECH_TEXT_DATA", shared / "data" / "gpt-sovits-text")), encoding="utf-8")
    dora = _dora()
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "RUST_BACKTRACE": "0",
           "DORA_ZENOH_CONFIG_OVERLAY": str(ZENOH_OVERLAY), "DORA_COORDINATOR_PORT": str(_free_port())}

    def cli(*args, timeout=60, check=True):
        done = subprocess.run([dora, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)
        assert not check or done.returncode == 0, f"dora {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout + done.stderr

    cli("up")
    try:
        cli("start", "--detach", "--name", "params", str(flow), timeout=120)
        _wait_for(lambda: "text #1:" in _node_log(tmp_path), 240, "the first text to be spoken",
                  lambda: _node_log(tmp_path)[-3000:])
        assert "Set `voice`" in cli("param", "set", "primespeech", "voice", json.dumps(VOICE_2), "-d", "params")
        cli("param", "set", "primespeech", "speed", "1.25", "-d", "params")
        listed = json.loads(cli("param", "list", "primespeech", "-d", "params", "--format", "json"))
        assert listed == {"voice": VOICE_2, "speed": 1.25}
        report_path = tmp_path / "out" / "answers" / "report.json"
        _wait_for(report_path.exists, 240, "the dataflow's report", lambda: _node_log(tmp_path)[-3000:])
    finally:
        cli("stop", "params", check=False)
        cli("down", check=False)
    report = json.loads((tmp_path / "out" / "report.json").read_text(encoding="utf-8"))
    answers = json.loads(report_path.read_text(encoding="utf-8"))
    report["segments"], report["status"] = answers["segments"], answers["status"]
    segments = [s for s in check_one_answer_per_text(report, "") if s["text"] == "Hi there."]
    assert [s["outcome"] for s in segments] == ["completed", "completed"]
    voices = [a["voice"] for a in report["audio"] if not a.get("silent")]
    assert voices == [VOICE, VOICE_2]  # the parameter changed the voice of the next text
    changed = by_status(report, "voice_changed")
    assert len(changed) == 1 and changed[0]["metadata"]["parameter"] == "voice"
    speed = [s["body"] for s in by_status(report, "parameter_set")]
    assert speed and speed[0]["parameter"] == "speed" and speed[0]["value"] == 1.25
