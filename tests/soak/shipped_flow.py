"""The shipped dataflow.yaml, made runnable here: node paths made absolute, the TTS node given the tiny
voice built from the fixture models (tests/node/tiny_voice.py), and a chosen text source. For the soak
scripts in this folder (not unit tests)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BIN = Path(sys.executable).parent
sys.path[:0] = [str(REPO / "tests" / "node"), str(REPO / "tests")]
os.environ["PATH"] = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"

from tiny_voice import VOICE, make_model_dir  # noqa: E402


def shipped_flow(work: Path, source: dict | None = None, source_env: dict | None = None,
                 keep_grace: bool = True) -> Path:
    """Write ``work/dataflow.yaml``: dataflow.yaml with the tiny voice; ``source`` replaces the text_source
    node's ``path``/``env`` (its inputs and outputs stay as shipped); ``keep_grace=False`` removes every
    ``finish_grace_secs`` (the control run of the idle soak)."""
    shared = REPO.parent / "shared"
    flow = yaml.safe_load((REPO / "dataflow.yaml").read_text(encoding="utf-8"))
    model_dir = make_model_dir(work / "models")
    for node in flow["nodes"]:
        if not keep_grace:
            node.pop("finish_grace_secs", None)
        if node.get("path", "").endswith(".py"):
            node["path"] = str(REPO / node["path"])
        if node["id"] == "text_source":
            node.update(source or {})
            node["env"] = {**(node.get("env") or {}), **(source_env or {})}
        elif node["id"] == "primespeech":
            node["env"].update(VOICE_NAME=VOICE, PRIMESPEECH_MODEL_DIR=str(model_dir), GPTSVITS_WARMUP="false",
                               NLTK_DATA=os.environ.get("NLTK_DATA", str(shared / "nltk_data")),
                               PRIMESPEECH_TEXT_DATA=os.environ.get(
                                   "PRIMESPEECH_TEXT_DATA", str(shared / "data" / "gpt-sovits-text")))
        elif node["id"] == "wav_sink":
            node["env"] = {"OUTPUT_DIR": str(work / "out")}
    path = work / "dataflow.yaml"
    path.write_text(yaml.safe_dump(flow, allow_unicode=True), encoding="utf-8")
    return path


def dora_run(flow: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([str(BIN / "dora"), "run", str(flow)], cwd=flow.parent, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, **(env or {})})


def finish(proc: subprocess.Popen, timeout: float) -> tuple[int | str, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return "timeout", out


def node_pid(proc: subprocess.Popen, needle: str = "dora-primespeech-mlx") -> int | None:
    """The pid of the TTS node among the processes of ``dora run``'s session."""
    out = subprocess.run(["ps", "-eo", "pid,sid,args"], capture_output=True, text=True).stdout
    for line in out.splitlines()[1:]:
        pid, sid, args = line.split(None, 2)
        if int(sid) == proc.pid and needle in args:
            return int(pid)
    return None


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def wait_pid(proc: subprocess.Popen, timeout: float = 120) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        pid = node_pid(proc)
        if pid:
            return pid
        time.sleep(0.5)
    return None
