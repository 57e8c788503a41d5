"""Which setting keeps a silent dataflow alive on the installed dora? (issue 10, item 8a; not a unit test)

dora-rs 1.1's daemon has a "finish-straggler" watchdog: once every running node of a dataflow is quiescent
-- drained (all its inputs closed) or connected and *silent* (no message to the daemon) for longer than the
grace period (default 120 s) -- it stops them ("dataflow ... is finished except node ... escalating stop").
A voice-assistant flow has no source node (every node has inputs) and is silent between utterances, so it
matches. This probe runs a two-node flow of plain Python nodes (tests/soak/idle_nodes.py: ``src`` pings,
``echo`` acks; no TTS) with ``SILENCE`` seconds between two pings, once per variant, all variants at once:

- ``baseline``: nothing set;
- ``env_off``: ``DORA_FINISH_DRAIN_GRACE_SECS=off`` in the environment of ``dora run``;
- ``node_grace_all`` / ``node_grace_one``: the descriptor's per-node ``finish_grace_secs`` on every node /
  on one node only;
- ``dataflow_env``: ``DORA_FINISH_DRAIN_GRACE_SECS: "off"`` in the descriptor's top-level ``env:`` (reaches
  the nodes, not the daemon);
- ``timer``: a ``dora/timer`` input on the echo node;
- with ``--daemon``: the baseline and ``node_grace_one`` again under a private coordinator + daemon
  (``dora coordinator``/``dora daemon``/``dora start --attach``, ports 2xxxx so as not to meet other users'
  dora), and the daemon started with ``DORA_FINISH_DRAIN_GRACE_SECS=off``.

    python tests/soak/idle_probe.py [--silence 150] [--only baseline,env_off] [--daemon]

Prints one line per variant: survived (both pings acked, dora exited 0) or not, dora's exit code, and
whether dora logged the escalation.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
DORA = str(BIN / "dora")
# `path: x.py` nodes are started with the `python` on PATH: this interpreter's (it has dora-rs and pyarrow)
os.environ["PATH"] = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
GRACE_LONG = 86400.0  # one day


def flow(variant: str, result: Path, silence: float) -> dict:
    common_env = {"RESULT": str(result), "SILENCE": str(silence), "COUNT": "2"}
    src = {"id": "src", "path": str(HERE / "idle_nodes.py"), "inputs": {"ack": "echo/ack"}, "outputs": ["ping"],
           "env": {**common_env, "ROLE": "src"}}
    echo = {"id": "echo", "path": str(HERE / "idle_nodes.py"), "inputs": {"ping": "src/ping"}, "outputs": ["ack"],
            "env": {**common_env, "ROLE": "echo"}}
    desc: dict = {"nodes": [src, echo]}
    if variant.startswith("node_grace_all"):
        src["finish_grace_secs"] = echo["finish_grace_secs"] = GRACE_LONG
    elif variant.startswith("node_grace_one"):
        echo["finish_grace_secs"] = GRACE_LONG
    elif variant == "dataflow_env":
        desc["env"] = {"DORA_FINISH_DRAIN_GRACE_SECS": "off"}
    elif variant == "timer":
        echo["inputs"]["tick"] = "dora/timer/millis/1000"
    return desc


def outcome(result: Path) -> list[dict]:
    if not result.exists():
        return []
    return [json.loads(line) for line in result.read_text(encoding="utf-8").splitlines() if line.strip()]


def run_plain(variant: str, root: Path, silence: float) -> dict:
    work = root / variant
    work.mkdir(parents=True)
    result = work / "result.jsonl"
    path = work / "dataflow.yaml"
    path.write_text(yaml.safe_dump(flow(variant, result, silence)), encoding="utf-8")
    env = dict(os.environ)
    env.pop("DORA_FINISH_DRAIN_GRACE_SECS", None)
    if variant == "env_off":
        env["DORA_FINISH_DRAIN_GRACE_SECS"] = "off"
    return _run([DORA, "run", str(path)], work, env, result, silence)


def _run(cmd: list[str], work: Path, env: dict, result: Path, silence: float) -> dict:
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=silence + 180)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        rc = "timeout"
    (work / "dora.log").write_text(out, encoding="utf-8")
    events = outcome(result)
    acked = sum(e["event"] == "acked" for e in events)
    return {"rc": rc, "acked": acked, "survived": rc == 0 and acked == 2,
            "escalated": "escalating stop" in out, "seconds": round(time.monotonic() - t0),
            "last": events[-1]["event"] if events else None, "log": str(work / "dora.log")}


def run_daemon(variant: str, root: Path, silence: float, port: int) -> dict:
    """A private coordinator and daemon (as `dora up` starts them, on other ports), then `dora start --attach`."""
    work = root / variant
    work.mkdir(parents=True)
    result = work / "result.jsonl"
    path = work / "dataflow.yaml"
    base = "node_grace_one" if "node_grace_one" in variant else "baseline"
    path.write_text(yaml.safe_dump(flow(base, result, silence)), encoding="utf-8")
    env = dict(os.environ)
    env.pop("DORA_FINISH_DRAIN_GRACE_SECS", None)
    daemon_env = dict(env)
    if variant.endswith("env_off"):
        daemon_env["DORA_FINISH_DRAIN_GRACE_SECS"] = "off"
    procs = []
    logs = [open(work / "coordinator.log", "w"), open(work / "daemon.log", "w")]  # noqa: SIM115
    try:
        procs.append(subprocess.Popen([DORA, "coordinator", "--port", str(port), "--store", "memory"], cwd=work,
                                      env=daemon_env, stdout=logs[0], stderr=subprocess.STDOUT,
                                      start_new_session=True))
        time.sleep(2)
        procs.append(subprocess.Popen([DORA, "daemon", "--coordinator-port", str(port), "--local-listen-port",
                                       str(port + 87)], cwd=work, env=daemon_env, stdout=logs[1],
                                      stderr=subprocess.STDOUT, start_new_session=True))
        time.sleep(3)
        env["DORA_COORDINATOR_PORT"] = str(port)
        res = _run([DORA, "start", "--attach", "--coordinator-port", str(port), str(path)], work, env, result,
                   silence)
        daemon_log = (work / "daemon.log").read_text(encoding="utf-8", errors="replace")
        res["escalated"] = res["escalated"] or "escalating stop" in daemon_log
        return res
    finally:
        for p in reversed(procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(p.pid, signal.SIGKILL)
        for f in logs:
            f.close()


PLAIN = ["baseline", "env_off", "node_grace_all", "node_grace_one", "dataflow_env", "timer"]
DAEMON = ["daemon_baseline", "daemon_node_grace_one", "daemon_env_off"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--silence", type=float, default=150.0, help="seconds between the two pings")
    ap.add_argument("--only", default="", help="comma-separated variants")
    ap.add_argument("--daemon", action="store_true", help="also (or with --only, only) the daemon-mode variants")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    args = ap.parse_args()
    variants = [v for v in args.only.split(",") if v] or (PLAIN + (DAEMON if args.daemon else []))
    root = Path(tempfile.mkdtemp(prefix="idle-probe-"))
    results: dict[str, dict] = {}
    threads = []
    port = 26013
    for v in variants:
        if v.startswith("daemon"):
            # daemon-mode variants one after another (each has its own coordinator), in one thread
            continue
        t = threading.Thread(target=lambda v=v: results.__setitem__(v, run_plain(v, root, args.silence)))
        t.start()
        threads.append(t)

    def daemons():
        for i, v in enumerate(x for x in variants if x.startswith("daemon")):
            results[v] = run_daemon(v, root, args.silence, port + 10 * i)

    t = threading.Thread(target=daemons)
    t.start()
    threads.append(t)
    for t in threads:
        t.join()
    print(f"dora idle probe: {args.silence:.0f} s of silence between two pings; work folder {root}")
    print(f"{'variant':24} {'survived':8} {'rc':>7} {'acked':>5} {'escalated':9} {'seconds':>7}  last event")
    for v in variants:
        r = results[v]
        print(f"{v:24} {str(r['survived']):8} {str(r['rc']):>7} {r['acked']:>5} {str(r['escalated']):9} "
              f"{r['seconds']:>7}  {r['last']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
