"""The cluster's data plane (Zenoh between daemons and nodes) on loopback.

- What dora 1.1's bundled Zenoh can and cannot do, checked against the real binaries: a ``tls/`` listener is refused
  ("Unicast not supported for tls protocol"), and ``transport.auth.usrpwd`` is accepted but not enforced: a plain
  Zenoh peer without credentials links with the daemons and reads the dataflow's keys. When a dora release
  bundles a Zenoh with TLS or authentication these assertions fail: then mutual TLS belongs in the shipped overlay.
- The set-up ``primespeech-mlx cluster-keys`` writes: coordinator and daemons started with the generated commands
  (the tunnel addresses stand in as 127.77.0.x on loopback) bind every listener to the tunnel address or to
  127.0.0.1, nothing to other addresses, so with WireGuard's interface and the firewall rule only authenticated
  tunnel peers reach dora; and the payloads (audio-sized float32 arrays) cross the machines unchanged.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from dora_primespeech_mlx.cluster_keys import write_cluster
from dora_primespeech_mlx.settings import ZENOH_OVERLAY

sys.path.insert(0, str(REPO / "examples" / "distributed"))
from loopback import Cluster, dora_exe, free_port  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.dora]
zenoh = pytest.importorskip("zenoh", reason="eclipse-zenoh (dev extra) not installed")

SEED = 7
SIZES = [40_000, 130_000, 260_000, 40_000, 260_000, 96_000]  # bytes: the range of an audio chunk (0.3-2 s)

SOURCE = f"""
import hashlib, json, sys, time
import numpy as np, pyarrow as pa
from dora import Node
node = Node()
rng = np.random.default_rng({SEED})
sent = []
for _ in range(3):  # the peers are surely linked before the payloads go out
    node.send_output("data", pa.array([0.0], type=pa.float32()), {{"warmup": True}})
    time.sleep(1.0)
for size in {SIZES}:
    audio = rng.standard_normal(size // 4).astype(np.float32)
    node.send_output("data", pa.array(audio), {{"sent": time.time()}})
    sent.append(hashlib.sha256(audio.tobytes()).hexdigest())
    time.sleep(0.3)
json.dump(sent, open(sys.argv[1], "w"))
"""

SINK = """
import hashlib, json, sys, time
import numpy as np
from dora import Node
node = Node()
got = []
for event in node:
    if event["type"] == "INPUT" and not event["metadata"].get("warmup"):
        audio = event["value"].to_numpy(zero_copy_only=False).astype(np.float32)
        latency = time.time() - event["metadata"]["sent"]
        got.append({"sha": hashlib.sha256(audio.tobytes()).hexdigest(), "latency": latency})
        json.dump(got, open(sys.argv[1], "w"))
"""


def dora_or_skip() -> None:
    try:
        dora_exe()
    except FileNotFoundError:
        pytest.skip("dora CLI (dora-rs-cli) not installed")


def flow(tmp: Path) -> Path:
    """source on edge -> sink on tts, both plain Python nodes."""
    (tmp / "source.py").write_text(SOURCE, encoding="utf-8")
    (tmp / "sink.py").write_text(SINK, encoding="utf-8")
    nodes = [
        {"id": "source", "deploy": {"machine": "edge"}, "path": sys.executable,
         "args": f"{tmp / 'source.py'} {tmp / 'sent.json'}", "outputs": ["data"]},
        {"id": "sink", "deploy": {"machine": "tts"}, "path": sys.executable,
         "args": f"{tmp / 'sink.py'} {tmp / 'got.json'}",
         "inputs": {"data": {"source": "source/data", "queue_size": 100}}},
    ]
    path = tmp / "dataflow.yaml"
    path.write_text(yaml.safe_dump({"nodes": nodes}, sort_keys=False), encoding="utf-8")
    return path


def outsider(endpoint: str, seconds: float) -> tuple[dict[str, int], int]:
    """A plain Zenoh peer without credentials: (key -> samples it read, peers it linked with)."""
    conf = zenoh.Config()
    conf.insert_json5("mode", '"peer"')
    conf.insert_json5("connect/endpoints", json.dumps([endpoint]))
    conf.insert_json5("scouting/multicast/enabled", "false")
    seen: dict[str, int] = {}
    with zenoh.open(conf) as session:
        session.declare_subscriber("**", lambda s: seen.__setitem__(str(s.key_expr), seen.get(str(s.key_expr), 0) + 1))
        time.sleep(seconds)
        peers = len(list(session.info.peers_zid()))
    return seen, peers


def test_dora_zenoh_has_neither_tls_nor_user_password(tmp_path):
    dora_or_skip()
    tls = tmp_path / "tls.json5"
    tls.write_text(json.dumps({"listen": {"endpoints": [f"tls/127.0.0.1:{free_port()}"]}}), encoding="utf-8")
    with Cluster(tmp_path / "tls", overlay=tls) as cluster:
        deadline = time.monotonic() + 30
        while "not supported for tls" not in cluster.log("edge", 400) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "Unicast not supported for tls protocol" in cluster.log("edge", 400)

    creds = tmp_path / "credentials.txt"
    creds.write_text("edge:e-secret\ntts:t-secret\n", encoding="utf-8")
    auth = tmp_path / "usrpwd.json5"
    auth.write_text(json.dumps({"transport": {"auth": {"usrpwd": {
        "user": "edge", "password": "e-secret", "dictionary_file": str(creds)}}}}), encoding="utf-8")
    with Cluster(tmp_path / "usrpwd", overlay=auth) as cluster:
        cluster.start_flow(flow(tmp_path), "open")
        seen, peers = outsider(cluster.zenoh, 4.0)
    assert peers >= 1 and any(key.startswith("dora/") for key in seen), seen  # read without credentials


def machine_args(script: Path) -> dict[str, list[str]]:
    """The dora commands of a generated commands.sh: role (coordinator/daemon) -> argv after `dora`."""
    out = {}
    for line in script.read_text(encoding="utf-8").splitlines():
        if line.startswith("dora "):
            argv = [str(ZENOH_OVERLAY) if a == "$(primespeech-mlx zenoh-overlay)" else a
                    for a in shlex.split(line.rstrip(" &"))[1:]]
            out[argv[0]] = argv
    return out


def listeners(pids: list[int]) -> set[str]:
    """Local addresses of the TCP sockets these processes listen on (ss)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    return {line.split()[3].rsplit(":", 1)[0] for line in out.splitlines()
            if any(f"pid={pid}," in line for pid in pids)}


def test_generated_set_up_binds_dora_to_the_tunnel_and_carries_audio_unchanged(tmp_path):
    dora_or_skip()
    if shutil.which("ss") is None:
        pytest.skip("ss (iproute2) not installed")
    zenoh_port, coordinator_port = free_port(), free_port()
    planned = write_cluster(tmp_path / "keys", [("edge", "192.0.2.10"), ("tts", "192.0.2.20")],
                            subnet="127.77.0.0/29", zenoh_port=zenoh_port, coordinator_port=coordinator_port)
    tunnel = {m.name: str(m.tunnel) for m in planned}
    args = {m.name: machine_args(tmp_path / "keys" / m.name / "commands.sh") for m in planned}
    assert "coordinator" in args["edge"] and "coordinator" not in args["tts"]
    # one loopback host plays both machines: the second daemon needs a Zenoh port of its own
    tts = args["tts"]["daemon"]
    tts[tts.index("--zenoh-listen") + 1] = f"{tunnel['tts']}:{free_port()}"
    edge = args["edge"]["daemon"]
    edge[edge.index("--zenoh-connect") + 1] = f"tcp/{tts[tts.index('--zenoh-listen') + 1]}"

    class Generated(Cluster):
        ADDRESS = tunnel["edge"]

        def daemon_args(self, name: str) -> list[str]:
            return [*args[name]["daemon"], "--local-listen-port", str(free_port())]

    cluster = Generated(tmp_path / "cluster")
    cluster.port = coordinator_port
    with cluster:
        cluster.start_flow(flow(tmp_path), "tunnel")
        deadline = time.monotonic() + 120
        while not (tmp_path / "got.json").exists() and time.monotonic() < deadline:  # data flows between them
            time.sleep(0.1)
        nodes = [pid for name in ("edge", "tts") for pid in cluster.node_pids(name)]
        bound = listeners([p.pid for p in cluster.procs.values()] + nodes)
        status = cluster.wait_flow("tunnel", timeout=120)
    assert status == "Finished", (status, cluster.log("edge"), cluster.log("tts"))
    assert bound and bound <= {*tunnel.values(), "127.0.0.1"}, bound  # nothing on a wildcard or another address
    sent = json.loads((tmp_path / "sent.json").read_text(encoding="utf-8"))
    got = json.loads((tmp_path / "got.json").read_text(encoding="utf-8"))
    assert [g["sha"] for g in got] == sent  # every payload, in order, bit for bit
    latencies = sorted(g["latency"] * 1000 for g in got)
    print(f"\n{len(got)} payloads of {min(SIZES) // 1000}-{max(SIZES) // 1000} KB edge -> tts, equal; latency median "
          f"{latencies[len(latencies) // 2]:.1f} ms; listeners: {sorted(bound)}")
    print(f"edge daemon: dora {' '.join(args['edge']['daemon'])}")
