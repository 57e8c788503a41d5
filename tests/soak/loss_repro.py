"""Are small messages (``segment_complete``) lost by dora, or by how a node sends? (issue 10, item 8b)

A minimal reproduction with plain Python nodes (tests/soak/loss_nodes.py, no TTS): ``src`` sends N texts,
``tts`` answers each with CHUNKS streaming 'audio' messages (32 kHz float32, CHUNK_S seconds each, so
>= 4 KB: dora's zero-copy shared-memory path), a 'log', a 'status' and a 'segment_complete'; ``sink``
receives all four outputs (like nodes/wav_sink.py), and ``src`` receives the segment_completes (like
nodes/text_source.py). Each configuration varies one thing:

- ``sender``: ``worker`` (a worker thread calls send_output while the main thread waits in next(), as the
  node form does on dora-rs 1.x) or ``main`` (every dora call on the main thread);
- ``q``: the sink's ``queue_size`` on each of its 4 inputs (dora's default is 10, drop-oldest; dora 1.x
  sizes a node's shared ingress channel as the sum of its inputs' queue sizes);
- ``chunk``: seconds of audio per chunk (0.01 s = 1.3 KB, below the 4 KB zero-copy threshold);
- ``delay``: the sink sleeps that long per audio message (a slow consumer);
- ``burst``: all texts at once, or one at a time (waiting for each answer, as dora-text-segmenter does).

    python tests/soak/loss_repro.py [--texts 1000] [--only NAME,...] [--repeat 1]

Prints one line per run: what tts sent and what src and sink received, and how many "discarding" /
"dropped" warnings dora printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
DORA = str(BIN / "dora")
os.environ["PATH"] = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"

# name: (sender, sink queue_size, chunk seconds, sink delay per audio, burst)
CONFIGS = {
    "worker-q10": ("worker", 10, 0.3, 0.0, True),
    "main-q10": ("main", 10, 0.3, 0.0, True),
    "worker-q10-small": ("worker", 10, 0.01, 0.0, True),
    "worker-q10-seq": ("worker", 10, 0.3, 0.0, False),
    "worker-q1000-seq": ("worker", 1000, 0.3, 0.0, False),
    "main-q1000-seq": ("main", 1000, 0.3, 0.0, False),
    "worker-q100": ("worker", 100, 0.3, 0.0, True),
    "main-q100": ("main", 100, 0.3, 0.0, True),
    "worker-q300": ("worker", 300, 0.3, 0.0, True),
    "worker-q1000": ("worker", 1000, 0.3, 0.0, True),
    "main-q1000": ("main", 1000, 0.3, 0.0, True),
    "worker-q1000-slow": ("worker", 1000, 0.3, 0.005, True),
    "worker-q10-slow": ("worker", 10, 0.3, 0.005, True),
    "worker-q10-slow-seq": ("worker", 10, 0.3, 0.005, False),
}


def flow(name: str, texts: int, chunks: int, result_dir: Path) -> dict:
    sender, q, chunk_s, delay, burst = CONFIGS[name]
    node = str(HERE / "loss_nodes.py")
    common = {"RESULT_DIR": str(result_dir)}
    return {"nodes": [
        {"id": "src", "path": node, "outputs": ["text"],
         "inputs": {"segment_complete": {"source": "tts/segment_complete", "queue_size": max(q, 10)}},
         "env": {**common, "ROLE": "src", "TEXTS": str(texts), "BURST": "1" if burst else "0", "SETTLE": "20"}},
        {"id": "tts", "path": node, "outputs": ["audio", "log", "status", "segment_complete"],
         "inputs": {"text": {"source": "src/text", "queue_size": texts + 10}},  # never the bottleneck
         "env": {**common, "ROLE": "tts", "SENDER": sender, "CHUNKS": str(chunks), "CHUNK_S": str(chunk_s)}},
        {"id": "sink", "path": node,
         "inputs": {k: {"source": f"tts/{k}", "queue_size": q} for k in ("audio", "log", "status",
                                                                          "segment_complete")},
         "env": {**common, "ROLE": "sink", "NAME": "sink", "DELAY_S": str(delay)}},
    ]}


def run(name: str, texts: int, chunks: int, root: Path) -> dict:
    work = root / name
    work.mkdir(parents=True)
    path = work / "dataflow.yaml"
    path.write_text(yaml.safe_dump(flow(name, texts, chunks, work)), encoding="utf-8")
    t0 = time.monotonic()
    proc = subprocess.Popen([DORA, "run", str(path)], cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=900)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        rc = "timeout"
    (work / "dora.log").write_text(out, encoding="utf-8")
    res = {}
    for role in ("src", "tts", "sink"):
        f = work / f"{role}.json"
        res[role] = json.loads(f.read_text(encoding="utf-8")) if f.exists() else {}
    res["rc"] = rc
    res["seconds"] = round(time.monotonic() - t0, 1)
    res["discard_warnings"] = len(re.findall(r"(?i)discard|dropp", out))
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--texts", type=int, default=1000)
    ap.add_argument("--chunks", type=int, default=3, help="audio messages per text")
    ap.add_argument("--only", default="")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n] or list(CONFIGS)
    root = Path(tempfile.mkdtemp(prefix="loss-repro-"))
    print(f"dora loss repro: {args.texts} texts x {args.chunks} audio chunks; work folder {root}", flush=True)
    print(f"{'config':22} {'sender':6} {'q':>4} {'chunk':>6} {'burst':5} | {'sc sent':>7} {'src got':>7} "
          f"{'sink sc':>7} {'sink st':>7} {'sink log':>8} {'audio':>11} | {'warn':>4} {'s':>5} rc", flush=True)
    for r in range(args.repeat):
        for name in names:
            res = run(name, args.texts, args.chunks, root / f"r{r}")
            sender, q, chunk_s, _delay, burst = CONFIGS[name]
            sent = res["tts"].get("sent", {})
            recv = res["sink"].get("received", {})
            chunk_kb = chunk_s * 32000 * 4 / 1024
            print(f"{name:22} {sender:6} {q:>4} {chunk_kb:>4.0f}KB {str(burst):5} | "
                  f"{sent.get('segment_complete', 0):>7} {res['src'].get('answered', 0):>7} "
                  f"{recv.get('segment_complete', 0):>7} {recv.get('status', 0):>7} {recv.get('log', 0):>8} "
                  f"{recv.get('audio', 0):>5}/{sent.get('audio', 0):<5} | {res['discard_warnings']:>4} "
                  f"{res['seconds']:>5} {res['rc']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
