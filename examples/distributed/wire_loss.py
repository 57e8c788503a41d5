"""Does dora lose messages between daemons? A model-free reproduction, with and without zenoh-overlay.json5.

On a loopback cluster (loopback.py) a publisher on ``tts`` sends, every ``--period`` seconds for
``--seconds``, one large message (``--kb`` KB of float32, like an audio chunk) and two small ones (like
``status`` and ``segment_complete``); a subscriber on ``edge`` (or on ``tts`` with ``--same-daemon``) records
what arrives, every input with ``queue_size: 1000``. Printed: messages sent / received / lost per output, once
with dora's Zenoh defaults and once with the overlay. ``--dora-run`` runs the two nodes in a plain
single-machine ``dora run`` instead (the overlay given through ``DORA_ZENOH_CONFIG_OVERLAY``).

    python examples/distributed/wire_loss.py [--seconds 12] [--kb 256] [--period 0.03] [--same-daemon | --dora-run]

Run as a node (``publisher`` / ``subscriber`` argument) by the dataflow it writes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from loopback import OVERLAY, Cluster, dora_exe  # noqa: E402

OUTPUTS = ("big", "small", "other")


def publisher() -> int:
    import numpy as np
    import pyarrow as pa
    from dora import Node

    node = Node()
    seconds, period = float(os.environ["SECONDS"]), float(os.environ["PERIOD"])
    big = pa.array([np.zeros(int(os.environ["KB"]) * 256, np.float32)])
    start, i = time.time(), 0
    while time.time() - start < seconds:
        node.send_output("big", big, {"i": i})
        node.send_output("small", pa.array(["status"]), {"i": i})
        node.send_output("other", pa.array(["segment_complete"]), {"i": i})
        i += 1
        time.sleep(period)
    Path(os.environ["OUT"], "sent.json").write_text(json.dumps({"sent": i}))
    return 0


def subscriber() -> int:
    from dora import Node

    node = Node()
    got = {k: [] for k in OUTPUTS}
    for event in node:
        if event["type"] == "INPUT":
            got[event["id"]].append(event["metadata"]["i"])
    Path(os.environ["OUT"], "got.json").write_text(json.dumps(got))
    return 0


def run(tmp: Path, overlay: Path | None, args) -> dict:
    tmp.mkdir(parents=True)
    env = {"SECONDS": str(args.seconds), "PERIOD": str(args.period), "KB": str(args.kb), "OUT": str(tmp)}
    me = str(Path(__file__).resolve())
    flow = {"nodes": [
        {"id": "pub", "deploy": {"machine": "tts"}, "path": me, "args": "publisher", "outputs": list(OUTPUTS),
         "env": env},
        {"id": "sub", "deploy": {"machine": "tts" if args.same_daemon else "edge"}, "path": me, "args": "subscriber",
         "env": env,
         "inputs": {k: {"source": f"pub/{k}", "queue_size": 1000} for k in OUTPUTS}},
    ]}
    path = tmp / "dataflow.yaml"
    if args.dora_run:  # one `dora run` process, no cluster; the overlay through DORA_ZENOH_CONFIG_OVERLAY
        flow = {"nodes": [{k: v for k, v in n.items() if k != "deploy"} for n in flow["nodes"]]}
        path.write_text(yaml.safe_dump(flow, sort_keys=False), encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if k != "DORA_ZENOH_CONFIG_OVERLAY"}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        if overlay:
            env["DORA_ZENOH_CONFIG_OVERLAY"] = str(overlay)
        subprocess.run([dora_exe(), "run", str(path)], cwd=tmp, env=env, check=True, capture_output=True,
                       timeout=args.seconds + 120)
    else:
        path.write_text(yaml.safe_dump(flow, sort_keys=False), encoding="utf-8")
        with Cluster(tmp / "cluster", overlay=overlay) as cluster:
            cluster.start_flow(path, "loss")
            status = cluster.wait_flow("loss", args.seconds + 120)
        if status != "Finished":
            raise RuntimeError(f"dataflow ended {status}")
    sent = json.loads((tmp / "sent.json").read_text())["sent"]
    got = json.loads((tmp / "got.json").read_text())
    return {k: (sent, len(set(v)), sorted(set(range(sent)) - set(v))) for k, v in got.items()}


def main() -> int:
    if sys.argv[1:2] == ["publisher"]:
        return publisher()
    if sys.argv[1:2] == ["subscriber"]:
        return subscriber()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=12)
    ap.add_argument("--kb", type=int, default=256)
    ap.add_argument("--period", type=float, default=0.03)
    ap.add_argument("--same-daemon", action="store_true", help="both nodes on the tts daemon")
    ap.add_argument("--dora-run", action="store_true", help="both nodes in one `dora run` (no cluster)")
    args = ap.parse_args()
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="wire-loss-"))
    where = "dora run" if args.dora_run else "same daemon" if args.same_daemon else "tts -> edge"
    for label, overlay in (("dora defaults", None), ("zenoh-overlay.json5", OVERLAY)):
        result = run(root / label.replace(" ", "-"), overlay, args)
        lost = sum(len(m) for *_, m in result.values())
        total = sum(s for s, *_ in result.values())
        detail = ", ".join(f"{k} {r}/{s}" for k, (s, r, _) in result.items())
        print(f"{where}, {label:<20}: {lost} of {total} messages lost ({detail} received)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
