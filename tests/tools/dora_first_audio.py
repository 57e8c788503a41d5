"""The node's start under a real ``dora run``: from the TTS node's process start to its first ``audio`` message seen
by a receiving node, with a text sent at the dataflow's start. The voice: the bench's real-size Chinese voice
(``bench/weights.py``, written once under ``PRIMESPEECH_CACHE_DIR``), installed as a user voice in a temporary
model folder; its reference features come from the cache after the first run. Not a test: the figure behind
docs/performance.md ("Start-up").

    python tests/tools/dora_first_audio.py --runs 3 [--warmup false] [--streaming true]

Per run it prints the seconds from the TTS process's start (``/proc/<pid>/stat``, 10 ms ticks since boot) to the
receiver's first ``audio`` message, and to the text's ``segment_complete``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # this checkout's package

from dora_primespeech_mlx.bench.weights import PROMPT_TEXT, default_models_dir, ensure_models  # noqa: E402
from dora_primespeech_mlx.settings import ZENOH_OVERLAY  # noqa: E402

SOURCE = '''
import time
import pyarrow as pa
from dora import Node
node = Node()
node.send_output("text", pa.array(["TEXT"]), {})
for event in node:
    if event["type"] == "INPUT" and event["id"] == "segment_complete":
        break
node.send_output("done", pa.array(["done"]), {})
'''

RECEIVER = r'''
import json, os, sys, time
from dora import Node

def tts_start(model_dir):
    """When this flow's TTS node's process started (its command line names the node, its environment this flow's
    model folder), in seconds since boot (``/proc/<pid>/stat``, the clock of ``CLOCK_BOOTTIME``)."""
    ticks = os.sysconf("SC_CLK_TCK")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            if "dora-primespeech-mlx" not in cmd and "dora_primespeech_mlx.node" not in cmd:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"PRIMESPEECH_MODEL_DIR={model_dir}".encode() not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return int(fields[19]) / ticks
        except OSError:
            continue
    return None

def candidates():
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "primespeech" in cmd:
            found.append(cmd[:200])
    return found

node = Node()
out = {"first_audio": None, "complete": None, "start": tts_start(sys.argv[2])}  # (dora spawned the TTS before this)
if out["start"] is None:
    out["seen"] = candidates()
for event in node:
    if event["type"] != "INPUT":
        continue
    now = time.clock_gettime(time.CLOCK_BOOTTIME)
    if event["id"] == "audio" and out["first_audio"] is None:
        out["first_audio"] = now
    elif event["id"] == "segment_complete" and out["complete"] is None:
        out["complete"] = now
with open(sys.argv[1], "w") as f:
    json.dump(out, f)
'''

FLOW = '''
nodes:
  - id: source
    path: {source}
    inputs:
      segment_complete: primespeech/segment_complete
    outputs: [text, done]
  - id: primespeech
    path: dora-primespeech-mlx
    inputs:
      text: source/text
    outputs: [audio, segment_complete, status, log]
    env:
      VOICE_NAME: Bench
      PRIMESPEECH_MODEL_DIR: {model_dir}
      STREAMING: "{streaming}"
      GPTSVITS_WARMUP: "{warmup}"
      PRIMESPEECH_AUTO_DOWNLOAD: "false"
      NLTK_DATA: "{nltk_data}"
      PRIMESPEECH_TEXT_DATA: "{text_data}"
  - id: receiver
    path: {receiver}
    args: {result} {model_dir}
    inputs:
      audio:
        source: primespeech/audio
        queue_size: 100
      segment_complete: primespeech/segment_complete
'''


def voice_folder(root: Path, models: Path) -> None:
    folder = root / "voices" / "Bench"
    folder.mkdir(parents=True, exist_ok=True)
    data = {"name": "Bench", "language": "zh", "prompt_text": PROMPT_TEXT, "prompt_lang": "zh", "speed_factor": 1.0,
            **{k: str(models / k) for k in ("gpt", "sovits", "hubert", "bert")},
            "reference": str(models / "reference.wav")}
    (folder / "voice.yaml").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")  # (YAML: JSON is)
    text_data = os.environ.get("PRIMESPEECH_TEXT_DATA")
    if text_data and not (root / "text-data").exists():
        (root / "text-data").symlink_to(text_data)


def one_run(tmp: Path, args) -> dict:
    result = tmp / "result.json"
    result.unlink(missing_ok=True)
    (tmp / "source.py").write_text(SOURCE.replace("TEXT", args.text), encoding="utf-8")
    (tmp / "receiver.py").write_text(RECEIVER, encoding="utf-8")
    flow = tmp / "dataflow.yaml"
    flow.write_text(FLOW.format(source=tmp / "source.py", receiver=tmp / "receiver.py", result=result,
                                model_dir=tmp / "models", streaming=args.streaming, warmup=args.warmup,
                                nltk_data=os.environ.get("NLTK_DATA", ""),
                                text_data=os.environ.get("PRIMESPEECH_TEXT_DATA", tmp / "models" / "text-data")),
                    encoding="utf-8")
    env = {**os.environ, "DORA_ZENOH_CONFIG_OVERLAY": str(ZENOH_OVERLAY),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.Popen(["dora", "run", str(flow)], cwd=tmp, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
    if not result.exists():
        raise SystemExit(f"no result (dora run exit {proc.returncode}):\n{output[-3000:]}")
    out = json.loads(result.read_text(encoding="utf-8"))
    out["output"] = output
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--text", default="你好。")
    p.add_argument("--warmup", default="true", choices=("true", "false"))
    p.add_argument("--streaming", default="false", choices=("true", "false"))
    p.add_argument("--timeout", type=float, default=300)
    args = p.parse_args()
    models = ensure_models(default_models_dir())
    firsts = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        voice_folder(tmp / "models", models)
        for i in range(args.runs):
            t0 = time.clock_gettime(time.CLOCK_BOOTTIME)
            r = one_run(tmp, args)
            if r["start"] is None or r["first_audio"] is None:
                raise SystemExit(f"run {i + 1}: incomplete {r}")  # (its "output": dora's)
            first = r["first_audio"] - r["start"]
            firsts.append(first)
            print(f"run {i + 1}: TTS process start -> first audio {first:.2f} s, -> segment_complete "
                  f"{r['complete'] - r['start']:.2f} s (dora run -> TTS start {r['start'] - t0:.2f} s; "
                  f"loadavg {os.getloadavg()[0]:.2f})", flush=True)
    print(f"median first audio {statistics.median(firsts):.2f} s after the TTS process start "
          f"(warm-up {args.warmup}, streaming {args.streaming}, {args.runs} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
