"""The node in a multi-machine dora cluster, on loopback: a token-protected coordinator and two daemons
(``edge``, ``tts``) with a Zenoh peer on 127.0.0.1 (examples/distributed/loopback.py), the distributed example
dataflow started with ``dora start``, a voice built from the fixture models.

- every text gets exactly one ``segment_complete`` on ``edge``, and the audio received on ``edge`` equals, sample
  for sample, what the same texts give in a single-machine ``dora run`` (fixed seed);
- a ``dora start``/``dora stop``/``dora list`` without the token (or with a wrong one), and a daemon without
  it, are refused and the dataflow keeps running;
- the TTS machine goes away in the middle of a streamed text (its daemon SIGKILLed; the node, in a process group
  of its own, exits by itself within 3 s): coordinator and ``edge`` survive, the text in flight gets no answer,
  the daemon comes back, dora re-spawns the node on it and the next texts are served.

Everything the tests start is ended by the fixture (``Cluster.stop``: the process groups it started and every node
process seen), also when a test fails; the session fixture in tests/conftest.py fails the run on any survivor.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import REPO
from tiny_voice import VOICE, make_model_dir

sys.path.insert(0, str(REPO / "examples" / "distributed"))
from loopback import OVERLAY, Cluster, _start_time, dora_exe  # noqa: E402

pytestmark = [pytest.mark.dora, pytest.mark.slow]

EXAMPLE = REPO / "examples" / "distributed" / "dataflow.yaml"
PROBE = REPO / "examples" / "distributed" / "audio_probe.py"
SOURCE = REPO / "examples" / "distributed" / "resilient_source.py"
SEED = 4242
SHARED = REPO.parent / "shared"
FROM_TTS = {"audio": "primespeech/audio", "segment_complete": "primespeech/segment_complete",
            "status": "primespeech/status"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    try:
        dora_exe()
    except FileNotFoundError:
        pytest.skip("dora CLI (dora-rs-cli) not installed")
    c = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("models"))


def tts_env(model_dir: Path) -> dict:
    # PYTHONPATH: the node runs this checkout's package even where the console script's install is another one;
    # fixed window steps: a paced stream's windows follow the speeds each run measures, so two runs of the same flow
    # (across daemons, then on one machine) may cut a sentence differently; the comparison is of the data path
    return {"PYTHONPATH": str(REPO), "VOICE_NAME": VOICE, "PRIMESPEECH_MODEL_DIR": str(model_dir), "STREAMING": "true",
            "PRIMESPEECH_STREAM_PACE": "false",
            "GPTSVITS_WARMUP": "false", "SEED": str(SEED), "LOG_LEVEL": "INFO",
            "NLTK_DATA": os.environ.get("NLTK_DATA", str(SHARED / "nltk_data")),
            "PRIMESPEECH_TEXT_DATA": os.environ.get("PRIMESPEECH_TEXT_DATA", str(SHARED / "data" / "gpt-sovits-text"))}


def probe_node(node_id: str, machine: str, out: Path) -> dict:
    return {"id": node_id, "deploy": {"machine": machine}, "path": str(PROBE), "env": {"OUTPUT_DIR": str(out)},
            "inputs": {k: {"source": v, "queue_size": 1000} for k, v in FROM_TTS.items()}}


def render(tmp: Path, script: str, model_dir: Path) -> dict:
    """The distributed example with this checkout's absolute paths, the fixture voice, a scripted source, and
    an audio probe on edge that keeps the float samples."""
    flow = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "script.txt").write_text(script, encoding="utf-8")
    for node in flow["nodes"]:
        node["deploy"].pop("working_dir", None)
        if node["path"].endswith(".py"):
            node["path"] = str(REPO / node["path"])
        if node["id"] == "text_source":
            node["env"] = {"SCRIPT_FILE": str(tmp / "script.txt")}
        elif node["id"] == "primespeech":
            node["env"] = tts_env(model_dir)
        elif node["id"] == "wav_sink":
            node["env"] = {"OUTPUT_DIR": str(tmp / "out")}
    flow["nodes"].append(probe_node("probe", "edge", tmp / "probe"))
    return flow


def write(flow: dict, path: Path, deploy: bool = True) -> Path:
    if not deploy:  # `dora run` refuses `deploy:` sections (dora 1.1)
        flow = {**flow, "nodes": [{k: v for k, v in n.items() if k != "deploy"} for n in flow["nodes"]]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(flow, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


def dora_run(flow: Path, timeout: float = 300) -> str:
    # the overlay also keeps a single `dora run` from dropping small messages after large ones (wire_loss.py)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "RUST_BACKTRACE": "0", "DORA_ZENOH_CONFIG_OVERLAY": str(OVERLAY)}
    proc = subprocess.Popen([dora_exe(), "run", str(flow)], cwd=flow.parent, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"dora run did not finish in {timeout} s:\n{output[-4000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # nothing of the run outlives the test
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, output[-4000:]
    return output


def probe(out: Path) -> tuple[list[dict], dict[str, np.ndarray]]:
    events = json.loads((out / "probe.json").read_text(encoding="utf-8"))["events"]
    with np.load(out / "audio.npz") as data:
        audio = {k: data[k] for k in data.files}
    return events, audio


def answers(events: list[dict]) -> list[tuple[str, str, str]]:
    return [(e["question_id"], e["segment_index"], e["value"]) for e in events if e["input"] == "segment_complete"]


def texts_of(script: str) -> list[tuple[str, str]]:
    """(question_id, segment_index) of every text text_source sends for a script, its flushes included."""
    keys, q, s = [], 1, 0
    for line in [*script.splitlines(), ""]:
        if line.startswith(("#", "@")):
            continue
        if not line.strip():
            if s:
                keys.append((str(q), str(s)))
                q, s = q + 1, 0
            continue
        keys.append((str(q), str(s)))
        s += 1
    return keys


SCRIPT = "\n".join([
    "@sleep 2",  # the flow is surely running while the unauthenticated calls are made
    "Hello world, this is a small test.",
    "Hi there.",
    "",
    "One small test. Two small tests. Three small tests.",
    "It runs without PyTorch.",
]) + "\n"


def test_across_daemons_equals_single_machine_and_strangers_are_refused(cluster, model_dir, tmp_path):
    flow = render(tmp_path / "cluster", SCRIPT, model_dir)
    name = "equality"
    t0 = time.monotonic()
    cluster.start_flow(write(flow, tmp_path / "cluster" / "dataflow.yaml"), name)

    # -- strangers: no token, a wrong token ------------------------------------------------------------
    refused = []
    assert cluster.status(name) == "Running"
    other = write(render(tmp_path / "intruder", "Hi there.\n", model_dir), tmp_path / "intruder" / "flow.yaml")
    for token in (False, "0" * 64):
        for args in (("stop", name), ("stop", "--all"), ("start", str(other), "--name", "intruder", "--detach"),
                     ("list",)):
            result = cluster.cli(*args, token=token, check=False, timeout=30)
            assert result.returncode != 0, (args, result.stdout)
            assert "401" in result.stderr or "Unauthorized" in result.stderr, result.stderr[-2000:]
            who = "no token" if token is False else "wrong token"
            refused.append(" ".join(a for a in args[:2] if not a.endswith(".yaml")) + f" ({who})")
    stranger = cluster.start_daemon("stranger", token=False)  # a daemon without the token cannot join
    deadline = time.monotonic() + 30
    while "401 Unauthorized" not in cluster.log("stranger") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "401 Unauthorized" in cluster.log("stranger"), cluster.log("stranger")
    assert stranger.poll() is None and "stranger" not in cluster.connected_daemons()
    cluster.kill_daemon("stranger")
    refused.append("daemon (no token)")
    assert cluster.status(name) == "Running"
    assert "intruder" not in [d["name"] for d in cluster.dataflows()]

    status = cluster.wait_flow(name, timeout=300)
    cluster_s = time.monotonic() - t0
    assert status == "Finished", (status, cluster.log("edge"), cluster.log("tts"))
    events, audio = probe(tmp_path / "cluster" / "probe")

    # -- every text exactly one segment_complete on edge (the probe and wav_sink's report) ---------------
    sent = texts_of(SCRIPT)
    got = answers(events)
    assert sorted((q, s) for q, s, _ in got) == sorted(sent), got
    report = json.loads((tmp_path / "cluster" / "out" / "report.json").read_text(encoding="utf-8"))
    assert sorted((s["question_id"], str(s["segment_index"])) for s in report["segments"]) == sorted(sent)
    assert all(s["outcome"] in ("completed", "skipped") for s in report["segments"]), report["segments"]
    assert [o for *_, o in got].count("completed") == len(sent) - 2  # two flushes: skipped

    # -- the same flow on one machine (`dora run`) ------------------------------------------------------
    t1 = time.monotonic()
    single = render(tmp_path / "single", SCRIPT, model_dir)
    dora_run(write(single, tmp_path / "single" / "dataflow.yaml", deploy=False))
    single_s = time.monotonic() - t1
    events_1, audio_1 = probe(tmp_path / "single" / "probe")
    assert sorted(answers(events_1)) == sorted(got)
    assert sorted(audio) == sorted(audio_1) and audio, (sorted(audio), sorted(audio_1))
    for key in audio:
        assert audio[key].dtype == np.float32 and audio_1[key].dtype == np.float32
        np.testing.assert_array_equal(audio[key], audio_1[key], err_msg=key)
    total = sum(a.size for a in audio.values())
    wavs = sorted((tmp_path / "cluster" / "out").glob("question_*.wav"))
    assert [w.name for w in wavs] == [w.name for w in sorted((tmp_path / "single" / "out").glob("question_*.wav"))]
    for wav in wavs:
        assert wav.read_bytes() == (tmp_path / "single" / "out" / wav.name).read_bytes(), wav.name

    print(f"\ncluster: {len(sent)} texts sent, {len(got)} segment_complete on edge; {len(audio)} audio messages, "
          f"{total} samples ({total / 32000:.2f} s) equal sample for sample to dora run")
    print(f"refused: {', '.join(refused)}")
    print(f"dora start (cluster) {cluster_s:.1f} s, dora run {single_s:.1f} s")


LONG = " ".join(f"Sentence number {n}, a small test." for n in range(1, 13))


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []


def _wait(what: str, until, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while True:
        found = until()
        if found:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} in {timeout} s")
        time.sleep(0.05)


def _is(e: dict, inp: str, key=None, status=None) -> bool:
    if e["input"] != inp or (key is not None and (e["question_id"], e["segment_index"]) != key):
        return False
    return status is None or (e.get("value") or {}).get("status") == status


def test_tts_machine_goes_away_mid_stream(cluster, model_dir, tmp_path):
    """The TTS node is SIGKILLed while it streams a text (restart_policy brings it back), then the whole tts
    daemon with its node (the machine goes away; the daemon is started again and the dataflow restarted)."""
    script = "\n".join(["Hello world, this is a small test.", LONG, "Hi there.", LONG, "One small test."]) + "\n"
    flow = render(tmp_path, script, model_dir)
    flow["nodes"] = [n for n in flow["nodes"] if n["id"] != "wav_sink"]
    source = next(n for n in flow["nodes"] if n["id"] == "text_source")
    source.update(path=str(SOURCE), outputs=["text"], env={**source["env"], "OUTPUT_DIR": str(tmp_path / "source")})
    tts = next(n for n in flow["nodes"] if n["id"] == "primespeech")
    del tts["inputs"]["control"]  # an input wired to an output nobody declares never closes: the node would not end
    name = "kill"
    log = tmp_path / "probe" / "events.jsonl"
    coordinator, edge = cluster.procs["coordinator"], cluster.procs["edge"]
    cluster.start_flow(write(flow, tmp_path / "dataflow.yaml"), name)
    edge_nodes = _wait("edge nodes", lambda: len(cluster.node_pids("edge")) == 2 and cluster.node_pids("edge"))

    # -- 1. the node dies mid-stream ------------------------------------------------------------------
    long1 = ("1", "1")
    _wait("audio of the long text", lambda: any(_is(e, "audio", long1) for e in _events(log)))
    tts_node = [pid for pid, cmd in cluster.node_pids("tts").items() if "dora-primespeech-mlx" in cmd]
    assert len(tts_node) == 1, cluster.node_pids("tts")
    before = len(_events(log))
    t_kill = time.time()
    os.kill(tts_node[0], signal.SIGKILL)
    ready = _wait("ready from the restarted node", lambda: [
        e for e in _events(log)[before:] if _is(e, "status", status="ready")], timeout=120)[0]
    done = _wait("answer to the re-sent text", lambda: [
        e for e in _events(log)[before:] if _is(e, "segment_complete", long1)], timeout=180)[0]
    after_kill = _events(log)[before:]
    lost_chunks = [e for e in after_kill if _is(e, "audio", long1) and e["arrived"] < ready["arrived"]]
    assert not [e for e in after_kill if _is(e, "segment_complete", long1) and e["arrived"] < ready["arrived"]]
    assert done["value"] == "completed"
    chunks_before = [e for e in _events(log)[:before] if _is(e, "audio", long1)]
    assert chunks_before and not any(e["metadata"].get("is_final") for e in chunks_before)  # cut off mid-text
    resent = [e for e in after_kill if _is(e, "audio", long1) and e["arrived"] > ready["arrived"]]
    assert resent and resent[-1]["metadata"].get("is_final") and resent[0]["metadata"].get("chunk_index") == 0
    assert coordinator.poll() is None and edge.poll() is None
    assert cluster.node_pids("edge") == edge_nodes  # the edge nodes never noticed more than the silence
    node_recovery = (ready["arrived"] - t_kill, done["arrived"] - t_kill)

    # -- 2. the tts machine goes away mid-stream (daemon and node SIGKILLed), then comes back ------------
    long2 = ("1", "3")
    _wait("audio of the second long text", lambda: any(_is(e, "audio", long2) for e in _events(log)), timeout=180)
    orphans = {pid: _start_time(pid) for pid, cmd in cluster.node_pids("tts").items() if "dora-primespeech-mlx" in cmd}
    t_down = time.time()
    cluster.kill_daemon("tts")
    time.sleep(3)
    assert not [pid for pid, started in orphans.items() if _start_time(pid) == started], "the node outlived its daemon"
    assert coordinator.poll() is None and edge.poll() is None
    assert cluster.node_pids("edge") == edge_nodes and cluster.status(name) == "Running"
    assert "tts" not in cluster.connected_daemons()
    silent = [e for e in _events(log) if e["arrived"] > t_down + 1]
    assert not silent, silent  # nothing arrives from the dead machine; no event tells edge about it either
    cluster.start_daemon("tts")
    cluster.wait_daemons(["tts"])
    time.sleep(1)
    t_back = time.time()
    node_restart = cluster.cli("node", "restart", "primespeech", "--dataflow", name, check=False)
    if node_restart.returncode != 0:  # dora 1.1: "no daemon connection" (the node's old daemon is gone)
        cluster.cli("restart", name, "--force")
    before = len(_events(log))
    ready2 = _wait("ready after the tts machine came back", lambda: [
        e for e in _events(log)[before:] if _is(e, "status", status="ready")], timeout=180)[0]
    status = cluster.wait_flow(name, timeout=300)
    assert status == "Finished", (status, cluster.log("tts"))
    assert coordinator.poll() is None and edge.poll() is None

    runs = [json.loads(p.read_text(encoding="utf-8")) for p in sorted((tmp_path / "source").glob("source-*.json"))]
    last = max(runs, key=lambda r: r["sent"][-1]["sent"])
    assert [s["outcome"] for s in last["sent"]] == ["completed"] * 5 + ["skipped"], last["sent"]
    first = [r for r in runs if r["lost"]]
    assert first and first[0]["lost"][0]["segment_index"] == 1 and first[0]["lost"][0]["resent"]
    print(f"\nnode SIGKILLed after {len(chunks_before)} audio chunk(s) of a streamed text: no segment_complete for "
          f"it, {len(lost_chunks)} more chunk(s) arrived; ready again after {node_recovery[0]:.1f} s, the re-sent "
          f"text answered after {node_recovery[1]:.1f} s")
    reason = next((ln.strip() for ln in node_restart.stderr.splitlines()
                   if ln.strip() and not ln.startswith(("[ERROR]", "Location", " "))), "?")
    how = "dora node restart" if node_restart.returncode == 0 else f"dora restart (node restart refused: {reason})"
    print(f"tts daemon SIGKILLed: coordinator, edge daemon and edge nodes alive, dataflow still 'Running', nothing "
          f"arrives; daemon restarted, {how}: ready {ready2['arrived'] - t_back:.1f} s later "
          f"({ready2['arrived'] - t_down:.1f} s after the kill); all {len(last['sent'])} texts of the restarted "
          f"flow answered")
