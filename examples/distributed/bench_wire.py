"""What the wire costs: the TTS node's streamed ``audio`` received on the other daemon vs on its own daemon.

Starts a loopback cluster (loopback.py: coordinator with token auth, daemons ``edge`` and ``tts``), runs a
dataflow with the TTS node on ``tts``, resilient_source.py on ``edge`` sending long paragraphs (one text each,
STREAMING=true), and two audio_probe.py listeners: ``probe_edge`` on ``edge`` (across daemons) and
``probe_tts`` on ``tts`` (same daemon as the node). Both receive the same messages, so the figures compare
the two paths within one run. Printed:

- what the wire adds per ``audio`` chunk: its arrival on ``edge`` minus its arrival on ``tts`` (one host clock),
  median / p90 / max (a send stamp per chunk is not available: see audio_probe.py);
- time from a text sent to its first chunk on each consumer; throughput: audio seconds and MB received per
  wall second, from the first text sent to the last chunk;
- real time: playing each path's chunks from the first arrival on, how many would arrive after the audio
  before them has run out (underruns), and the worst lateness.

    python examples/distributed/bench_wire.py --voice Doubao [--model-dir DIR] [--texts 3]
    python examples/distributed/bench_wire.py --tiny      # the test fixture voice (PRIMESPEECH_FIXTURES)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
from loopback import Cluster  # noqa: E402

PARAGRAPH = ("The people who use this node rarely run everything on one box. The language model runs on a GPU "
             "server, the microphone and the speaker sit on a robot or a laptop, and the speech synthesis belongs "
             "on the machine with the fastest accelerator. Messages cross machines over the network, and the audio "
             "has to keep up with the listener.")
RATE = 32000


def flow(tmp: Path, voice: str, model_dir: str | None, texts: int) -> dict:
    script = tmp / "script.txt"
    script.write_text("\n".join([PARAGRAPH] * texts) + "\n", encoding="utf-8")
    tts_env = {"VOICE_NAME": voice, "STREAMING": "true", "LOG_LEVEL": "INFO", "PYTHONPATH": str(REPO)}
    if model_dir:
        tts_env["PRIMESPEECH_MODEL_DIR"] = model_dir
    for var in ("NLTK_DATA", "PRIMESPEECH_TEXT_DATA"):
        if os.environ.get(var):
            tts_env[var] = os.environ[var]
    from_tts = {k: {"source": f"primespeech/{k}", "queue_size": 1000} for k in ("audio", "segment_complete", "status")}

    def probe(node_id: str, machine: str) -> dict:
        return {"id": node_id, "deploy": {"machine": machine}, "path": str(HERE / "audio_probe.py"),
                "inputs": from_tts, "env": {"OUTPUT_DIR": str(tmp / node_id)}}

    return {"nodes": [
        {"id": "text_source", "deploy": {"machine": "edge"}, "path": str(HERE / "resilient_source.py"),
         "inputs": {k: from_tts[k] for k in ("segment_complete", "status")}, "outputs": ["text"],
         "env": {"SCRIPT_FILE": str(script), "OUTPUT_DIR": str(tmp / "source")}},
        {"id": "primespeech", "deploy": {"machine": "tts"}, "path": "dora-primespeech-mlx",
         "inputs": {"text": {"source": "text_source/text", "queue_size": 1000}},
         "outputs": ["audio", "segment_complete", "status", "log"], "env": tts_env},
        probe("probe_edge", "edge"),
        probe("probe_tts", "tts"),
    ]}


def audio_events(events: list[dict]) -> dict[tuple, dict]:
    """Audio messages by (question_id, segment_index, n-th chunk of that text)."""
    found, counts = {}, {}
    for e in events:
        if e["input"] == "audio":
            key = (e["question_id"], e["segment_index"])
            n = counts.get(key, 0)
            counts[key] = n + 1
            found[(*key, n)] = e
    return found


def figures(audio: dict[tuple, dict], start: float) -> dict:
    keys = sorted(audio, key=lambda k: audio[k]["arrived"])
    arrived = np.array([audio[k]["arrived"] for k in keys])
    seconds = np.array([audio[k]["samples"] / RATE for k in keys])
    # playback from the first chunk of each text on: a chunk is late if it arrives after the audio before it ran out
    late, first = [], []
    for text in sorted({k[:2] for k in keys}):
        idx = [i for i, k in enumerate(keys) if k[:2] == text]
        due = arrived[idx[0]] + np.concatenate([[0.0], np.cumsum(seconds[idx])[:-1]])
        late.extend(arrived[idx] - due)
        first.append(audio[keys[idx[0]]]["age"])  # text sent -> its first chunk here (same host clock)
    late = np.array(late)
    wall = arrived.max() - start
    return {"chunks": len(keys), "first_audio_s": float(np.median(first)), "audio_s": seconds.sum(), "wall_s": wall,
            "audio_per_s": seconds.sum() / wall, "mb_per_s": seconds.sum() * RATE * 4 / wall / 1e6,
            "underruns": int((late > 1e-3).sum()), "worst_late_ms": max(0.0, late.max() * 1e3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--voice", default=os.environ.get("VOICE_NAME", "Doubao"))
    ap.add_argument("--model-dir", default=os.environ.get("PRIMESPEECH_MODEL_DIR"))
    ap.add_argument("--tiny", action="store_true", help="the voice built from the test fixtures")
    ap.add_argument("--texts", type=int, default=3, help="paragraphs to speak (one text each)")
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args()
    with Cluster() as cluster:
        tmp = cluster.root / "bench"
        tmp.mkdir()
        voice, model_dir = args.voice, args.model_dir
        if args.tiny:
            sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "node")]
            from tiny_voice import VOICE, make_model_dir

            voice, model_dir = VOICE, str(make_model_dir(tmp / "models"))
            shared = REPO.parent / "shared"
            os.environ.setdefault("NLTK_DATA", str(shared / "nltk_data"))
            os.environ.setdefault("PRIMESPEECH_TEXT_DATA", str(shared / "data" / "gpt-sovits-text"))
        path = tmp / "dataflow.yaml"
        path.write_text(yaml.safe_dump(flow(tmp, voice, model_dir, args.texts), sort_keys=False), encoding="utf-8")
        cluster.start_flow(path, "bench")
        status = cluster.wait_flow("bench", args.timeout)
        if status != "Finished":
            print(f"dataflow ended {status}:\n{cluster.log('tts')}", file=sys.stderr)
            return 1
        source = json.loads(next((tmp / "source").glob("source-*.json")).read_text(encoding="utf-8"))
        start = source["sent"][0]["sent"]
        audio = {p: audio_events(json.loads((tmp / p / "probe.json").read_text(encoding="utf-8"))["events"])
                 for p in ("probe_tts", "probe_edge")}
    answered = sum(s["outcome"] == "completed" for s in source["sent"])
    same, other = audio["probe_tts"], audio["probe_edge"]
    assert sorted(same) == sorted(other), "the two probes received different audio messages"
    skew = np.array([other[k]["arrived"] - same[k]["arrived"] for k in same]) * 1e3
    size = np.array([same[k]["samples"] * 4 / 1e3 for k in same])
    print(f"{args.texts} paragraph(s) of {len(PARAGRAPH)} characters, voice {voice}, streaming; "
          f"{answered}/{len(source['sent']) - 1} texts completed; {len(same)} audio chunks of {size.min():.0f}-"
          f"{size.max():.0f} KB reached both probes")
    print(f"the wire (tts -> edge over Zenoh) vs the same daemon, per chunk (arrival on edge - arrival on tts): "
          f"median {np.median(skew):.2f} ms, p90 {np.percentile(skew, 90):.2f} ms, max {skew.max():.2f} ms")
    print(f"{'consumer':<28}{'chunks':>7}{'1st audio':>11}{'audio/wall':>12}{'MB/s':>8}{'underruns':>11}"
          f"{'worst late':>12}")
    results = {}
    for probe, label in (("probe_tts", "same daemon (tts)"), ("probe_edge", "other daemon (edge)")):
        r = results[probe] = figures(audio[probe], start)
        print(f"{label:<28}{r['chunks']:>7}{r['first_audio_s']:>10.2f}s{r['audio_per_s']:>11.2f}x{r['mb_per_s']:>8.3f}"
              f"{r['underruns']:>11}{r['worst_late_ms']:>10.1f}ms")
    for probe, label in (("probe_edge", "across daemons"), ("probe_tts", "on the same daemon")):
        r = results[probe]
        verdict = "real-time" if r["audio_per_s"] >= 1 and r["underruns"] == 0 else "NOT real-time"
        print(f"{label}: {r['audio_s']:.1f} s of audio in {r['wall_s']:.1f} s from the first text: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
