"""A ``dora-primespeech-mlx`` node whose daemon is SIGKILLed exits within a few seconds, whether the daemon dies
while the node loads its models (the node notices its parent is gone), waits for texts, or streams one (dora 1.1
sends one ERROR event, "daemon channel broken", and then blocks in ``next()`` for ever; the node exits on that
event or on the parent check, whichever comes first). Before, a node killed in the middle of a stream ran on,
re-parented to init, until killed by hand. The loopback cluster of examples/distributed/loopback.py; its
``stop()`` ends every node process that outlived its daemon."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO
from tiny_voice import VOICE, make_model_dir

sys.path.insert(0, str(REPO / "examples" / "distributed"))
from loopback import Cluster, _start_time, dora_exe  # noqa: E402

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="watches processes through /proc")

PROBE = REPO / "examples" / "distributed" / "audio_probe.py"
SOURCE = REPO / "nodes" / "text_source.py"
SHARED = REPO.parent / "shared"
EXIT_WITHIN_S = 5.0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("models"))


LONG = " ".join(f"Sentence number {n}, a small test." for n in range(1, 13))


def flow(tmp: Path, model_dir: Path, text: str | None) -> Path:
    """A source that keeps the text input open (after sending ``text``, streamed), the TTS node on ``tts``, a
    probe of its status and audio on ``edge``."""
    (tmp / "script.txt").write_text((f"& {text}\n" if text else "") + "@sleep 600\n", encoding="utf-8")
    env = {"STREAMING": "true", "PYTHONPATH": str(REPO), "VOICE_NAME": VOICE, "PRIMESPEECH_MODEL_DIR": str(model_dir),
           "GPTSVITS_WARMUP": "false", "NLTK_DATA": os.environ.get("NLTK_DATA", str(SHARED / "nltk_data")),
           "PRIMESPEECH_TEXT_DATA": os.environ.get("PRIMESPEECH_TEXT_DATA", str(SHARED / "data" / "gpt-sovits-text"))}
    nodes = [
        {"id": "source", "deploy": {"machine": "edge"}, "path": str(SOURCE),
         "env": {"SCRIPT_FILE": str(tmp / "script.txt")},
         "inputs": {"segment_complete": {"source": "primespeech/segment_complete", "queue_size": 1000},
                    "status": {"source": "primespeech/status", "queue_size": 1000}},
         "outputs": ["text", "control", "done"]},
        {"id": "primespeech", "deploy": {"machine": "tts"}, "path": "dora-primespeech-mlx", "env": env,
         "inputs": {"text": {"source": "source/text", "queue_size": 1000}},
         "outputs": ["audio", "segment_complete", "status", "log"]},
        {"id": "probe", "deploy": {"machine": "edge"}, "path": str(PROBE), "env": {"OUTPUT_DIR": str(tmp / "probe")},
         "inputs": {"status": {"source": "primespeech/status", "queue_size": 1000},
                    "audio": {"source": "primespeech/audio", "queue_size": 1000}}},
    ]
    path = tmp / "dataflow.yaml"
    path.write_text(yaml.safe_dump({"nodes": nodes}, sort_keys=False), encoding="utf-8")
    return path


def events(tmp: Path) -> list[dict]:
    path = tmp / "probe" / "events.jsonl"
    return [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []


def ready(tmp: Path) -> bool:
    return any(e["input"] == "status" and (e.get("value") or {}).get("status") == "ready" for e in events(tmp))


def streaming(tmp: Path) -> bool:
    return any(e["input"] == "audio" for e in events(tmp))


def wait(what: str, until, timeout: float):
    deadline = time.monotonic() + timeout
    while not (found := until()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} in {timeout} s")
        time.sleep(0.05)
    return found


def gone(pid: int, started: str) -> bool:
    """The process ended (a zombie left for init counts as ended)."""
    if _start_time(pid) != started:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.slow
@pytest.mark.dora
@pytest.mark.parametrize("when", ["loading", "idle", "streaming"])
def test_node_exits_when_its_daemon_is_killed(model_dir, tmp_path, when):
    try:
        dora_exe()
    except FileNotFoundError:
        pytest.skip("dora CLI (dora-rs-cli) not installed")
    cluster = Cluster(tmp_path / "cluster")
    try:
        cluster.start()
        cluster.start_flow(flow(tmp_path, model_dir, LONG if when == "streaming" else None), "loss")
        node = wait("tts node", lambda: [p for p, cmd in cluster.node_pids("tts").items()
                                         if "dora-primespeech-mlx" in cmd], timeout=60)[0]
        started = _start_time(node)
        if when == "idle":
            wait("ready", lambda: ready(tmp_path), timeout=240)
            time.sleep(0.5)  # the node is back in next()
        elif when == "streaming":
            wait("audio", lambda: streaming(tmp_path), timeout=240)  # the worker is inside the long text
        else:
            time.sleep(1.0)  # the node has imported dora and started loading the models
            assert not ready(tmp_path)
        t0 = time.monotonic()
        cluster.kill_daemon("tts")
        try:
            wait("exit of the orphaned node", lambda: gone(node, started), timeout=EXIT_WITHIN_S)
        except TimeoutError:
            pytest.fail(f"the node (pid {node}) still runs {EXIT_WITHIN_S} s after its daemon was SIGKILLed "
                        f"({when})")
        print(f"\nnode exited {time.monotonic() - t0:.2f} s after its daemon was SIGKILLed ({when})")
    finally:
        cluster.stop()  # ends the node too if it is still there


# -- the two signals, without dora ---------------------------------------------------------------------------

ORPHAN = """
import sys, time
from dora_primespeech_mlx.node import watch_parent
from dora_primespeech_mlx.settings import Settings
assert watch_parent(Settings()) is None  # not spawned by a daemon: no watch
assert watch_parent(Settings(dora_node_config="dataflow_id: x")) is not None
print("watching", flush=True)
time.sleep(60)
"""

PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "watching"
print(child.pid, flush=True)
time.sleep(0.5)
"""


def test_daemon_lost_event():
    from dora_primespeech_mlx.node import daemon_lost

    error = ("fatal event stream error: daemon channel broken\n\nCaused by:\n    server disconnected unexpectedly\n\n"
             "Location:\n    apis/rust/node/src/daemon_connection/tcp.rs:56:21")  # dora 1.1, verbatim
    assert daemon_lost({"type": "ERROR", "error": error})
    assert not daemon_lost({"type": "ERROR", "error": "Receiver timed out"})
    assert not daemon_lost({"type": "INPUT", "id": "text", "error": error})


def test_parent_watch_ends_an_orphan(tmp_path):
    import signal
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    parent = subprocess.run([sys.executable, "-c", PARENT, ORPHAN], capture_output=True, text=True, env=env,
                            timeout=120)
    assert parent.returncode == 0, parent.stderr
    orphan = int(parent.stdout.split()[0])
    started = _start_time(orphan)
    try:
        if started is not None:  # (None: it was gone already)
            wait("exit of the orphan", lambda: gone(orphan, started), timeout=EXIT_WITHIN_S)
    finally:
        if started is not None and _start_time(orphan) == started:
            os.kill(orphan, signal.SIGKILL)
