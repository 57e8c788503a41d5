"""WAV sink for dora-primespeech-mlx: one WAV per question plus a JSON report.

Inputs (all optional): ``audio``, ``segment_complete``, ``status``, ``log`` from the TTS node, ``text``
(what the source sent, for the report) and ``done`` from the source. Audio is collected by
``question_id`` (ListArray or flat float arrays) and written as 16-bit PCM at the metadata
``sample_rate`` (default 32000) to ``$OUTPUT_DIR/question_<id>.wav`` (default ``out/``), with
``$OUTPUT_DIR/report.json`` (:meth:`Sink.write`).

It writes them when all its inputs are closed (the source and the TTS node have finished); ``done``
from the source is recorded as ``"source_done"`` in the report. Its last line on stderr says what it wrote, and
that the TTS node could not start when its ``status`` said so. Console script: ``primespeech-demo-wav-sink``."""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import soundfile as sf
from dora import Node

from dora_primespeech_mlx.demo.tts_status import start_failure


def _plain(value):
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)


def audio_samples(value: pa.Array) -> np.ndarray:
    """Float samples of an ``audio`` value: ``pa.array([samples])`` (ListArray) or a flat array."""
    if pa.types.is_list(value.type) or pa.types.is_large_list(value.type):
        parts = [np.asarray(v, dtype=np.float32) for v in value.to_pylist() if v is not None]
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)
    return value.to_numpy(zero_copy_only=False).astype(np.float32)


def _json_text(value: pa.Array):
    try:
        text = value[0].as_py()
        return json.loads(text)
    except (ValueError, IndexError, TypeError):
        return str(value.to_pylist())


class Sink:
    def __init__(self, out_dir: Path):
        self.out_dir = out_dir
        self.audio: dict[str, list[np.ndarray]] = defaultdict(list)
        self.rate: dict[str, int] = {}
        self.questions: dict[str, dict] = defaultdict(
            lambda: {"segment_complete": [], "errors": [], "chunk_durations": []}
        )
        self.segments: list[dict] = []
        self.audio_md: list[dict] = []
        self.status: list = []
        self.log: list = []
        self.events = 0
        self.done = False
        self.trace: list[list] = []  # [arrival, input, question_id, segment_index] of every input

    def _segment(self, md: dict) -> dict:
        key = (str(md.get("question_id")), str(md.get("segment_index")))
        for seg in self.segments:
            if (seg["question_id"], str(seg["segment_index"])) == key and seg["outcome"] is None:
                return seg
        seg = {"question_id": key[0], "segment_index": md.get("segment_index"), "text": None, "outcome": None}
        self.segments.append(seg)
        return seg

    def on_input(self, input_id: str, value: pa.Array, md: dict) -> None:
        self.events += 1
        qid = str(md.get("question_id", "default"))
        self.trace.append([self.events, input_id, qid, str(md.get("segment_index"))])
        if input_id == "audio":
            samples = audio_samples(value)
            self.audio[qid].append(samples)
            self.rate[qid] = int(md.get("sample_rate", 32000))
            self.questions[qid]["chunk_durations"].append(len(samples) / self.rate[qid])
            self.audio_md.append(_plain({**md, "samples": len(samples), "value_type": str(value.type)}))
        elif input_id == "segment_complete":
            outcome = value[0].as_py() if len(value) else None
            self.questions[qid]["segment_complete"].append(outcome)
            if outcome == "error":
                self.questions[qid]["errors"].append({"error": md.get("error"), "stage": md.get("error_stage")})
            seg = self._segment(md)
            seg["outcome"] = outcome
            seg["metadata"] = _plain(md)
            seg["arrival"] = self.events
        elif input_id == "text":
            text = value[0].as_py() if pa.types.is_string(value.type) and len(value) else f"<{value.type}>"
            # dora does not order events from different senders: the answer to a text the node skips at once may
            # arrive before the text itself; such an answer waits here for its text
            key = (qid, str(md.get("segment_index")))
            early = next((s for s in self.segments if s["text"] is None and s["outcome"] is not None
                          and (s["question_id"], str(s["segment_index"])) == key), None)
            if early is not None:
                early["text"] = text
            else:
                self.segments.append({"question_id": qid, "segment_index": md.get("segment_index"), "outcome": None,
                                      "text": text})
        elif input_id == "status":
            self.status.append({"body": _json_text(value), "metadata": _plain(md), "arrival": self.events})
        elif input_id == "log":
            self.log.append(_json_text(value))

    def pending(self) -> int:
        return sum(1 for s in self.segments if s["outcome"] is None)

    def write(self) -> Path:
        """Write one WAV per question and ``report.json``; returns the report's path. The report::

            {"questions": {qid: {"wav", "sample_rate", "chunks", "duration", "chunk_durations",
                                 "segment_complete": [...], "errors": [...]}},
             "segments": [{"question_id", "segment_index", "text", "outcome", "metadata", "arrival"}],
             "audio": [metadata of every audio message], "status": [...], "log": [...], "events": n}

        (``arrival`` numbers the inputs in the order they arrived.)"""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        report = {"questions": {}, "segments": self.segments, "audio": self.audio_md, "status": self.status,
                  "log": self.log, "events": self.events, "source_done": self.done,
                  "trace": self.trace}
        for qid, info in self.questions.items():
            entry = dict(info)
            parts = self.audio.get(qid, [])
            if parts:
                audio = np.concatenate(parts)
                rate = self.rate[qid]
                path = self.out_dir / f"question_{qid}.wav"
                sf.write(path, np.clip(audio, -1.0, 1.0), rate, subtype="PCM_16")
                entry.update(wav=str(path), sample_rate=rate, chunks=len(parts), duration=len(audio) / rate)
            else:
                entry.update(wav=None, chunks=0, duration=0.0)
            report["questions"][qid] = entry
        path = self.out_dir / "report.json"
        path.write_text(json.dumps(report, ensure_ascii=False, indent=1, default=str), encoding="utf-8")
        return path


def main() -> int:
    node = Node()
    sink = Sink(Path(os.environ.get("OUTPUT_DIR", "out")))
    while True:
        event = node.next()  # blocking: dora-rs 1.1's next(timeout) can lose an event now and then
        if event is None or event["type"] == "STOP":
            break
        if event["type"] == "INPUT":
            if event["id"] == "done":
                sink.done = True
            else:
                sink.on_input(event["id"], event["value"], event.get("metadata") or {})
    path = sink.write()
    failure = next((f for s in sink.status if (f := start_failure(s["body"])) is not None), None)
    why = "; the TTS node could not start: its message (at the end) says why and what to do" if failure else ""
    print(f"wav_sink: wrote {path} ({len(sink.questions)} question(s)){why}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
