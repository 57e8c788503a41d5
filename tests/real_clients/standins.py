"""Stand-ins for the nodes of the client dataflows that cannot run here (microphone/AEC, ASR, LLM clients,
the Rust conference bridges and controller), and the probes that record what flows between the real nodes.

One script, the role in ``STANDIN_ROLE``. Every stand-in sends what the node it replaces sends (ids, value
types and metadata keys, read in that node's source; see tests/real_clients/README.md), driven by the JSON
script in ``CHECK_SCRIPT``. Coordination with the check (when the TTS is ready, when an answer has been
played) goes through files in ``CHECK_OUT``, never through extra dataflow inputs of the real nodes.

Roles: ``mic`` (mac-aec: speech events, ``audio_segment`` and ``question_ended`` with ``question_id``),
``asr`` (dora-asr: ``transcription`` with the segment's metadata and ``session_status: ended``), ``llm``
(``LLM_KIND=maas``: the Rust MaaS client, ``segment_index`` as a string, started/ongoing/ended and an empty
end marker; ``LLM_KIND=qwen3``: the local Qwen3 client, ``is_streaming``/``is_final`` and no
``segment_index``), ``bridge`` (conference bridge: a prompt on ``text`` when the controller resumes it),
``controller`` (conference controller: gives the turns), ``feeder`` (a segmenter-like text source for the
dora-hub flow: next text on each ``segment_complete``), ``idle`` (declared outputs, sends nothing) and
``probe`` (records inputs to ``<CHECK_OUT>/<PROBE_NAME>.jsonl``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from dora import Node

OUT = Path(os.environ.get("CHECK_OUT", "."))
QUIET_S = float(os.environ.get("CHECK_QUIET_S", "4"))  # no message and no sound for this long: answer over
PLAYED_IDLE_S = 1.5
STALL_S = float(os.environ.get("CHECK_STALL_S", "60"))
READY_S = 300.0
# Latencies of the real nodes (a transcription, an LLM's first tokens): without them the answer would reach
# the player before mac-aec's question_ended (sent ~1 s after the speech), which is not what happens live.
ASR_DELAY_S = float(os.environ.get("CHECK_ASR_DELAY_S", "0.5"))
LLM_DELAY_S = float(os.environ.get("CHECK_LLM_DELAY_S", "1.5"))


def script() -> dict:
    with open(os.environ["CHECK_SCRIPT"], encoding="utf-8") as f:
        return json.load(f)


def log_json(node: Node, name: str, level: str, message: str) -> None:
    node.send_output("log", pa.array([json.dumps({"node": name, "level": level, "message": message,
                                                  "timestamp": time.time()})]))


def write_json(path: Path, data) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")
    os.replace(tmp, path)


# -- what the probes and the null sink saw (files) ---------------------------------------------------------
def _probe_activity() -> float:
    """Time of the newest probe record."""
    latest = 0.0
    for p in OUT.glob("probe*.jsonl"):
        latest = max(latest, p.stat().st_mtime)
    return latest


def _sink() -> dict:
    best: dict = {}
    for p in OUT.glob("sink-*.json"):
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if data.get("last_voiced", 0) >= best.get("last_voiced", 0):
            best = data
    return best


def tts_ready(count: int) -> bool:
    path = OUT / "probe.jsonl"
    if not path.exists():
        return False
    n = 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec["input"].startswith("tts_status") and '"ready"' in str(rec.get("value")):
            n += 1
    return n >= count


def wait_ready(count: int) -> None:
    t0 = time.time()
    while not tts_ready(count) and time.time() - t0 < READY_S:
        time.sleep(0.2)


def wait_answered(since: float) -> dict:
    """Wait until the flow is quiet (no probe record and no sound for QUIET_S) after ``since``; a flow that
    stays quiet with nothing ever played also ends the wait (the report says what is missing)."""
    t0 = time.time()
    while True:
        time.sleep(0.25)
        now = time.time()
        sink = _sink()
        last = max(_probe_activity(), sink.get("last_voiced", 0.0), since)
        if now - last >= QUIET_S and now - sink.get("last_voiced", 0.0) >= PLAYED_IDLE_S:
            return {"waited_s": round(now - t0, 2), "timed_out": False}
        if now - t0 > STALL_S * 5:
            return {"waited_s": round(now - t0, 2), "timed_out": True}


def wait_played(seconds: float, since: float) -> None:
    """Wait until the device has played ``seconds`` of sound after ``since`` (barge-in timing)."""
    start = None
    t0 = time.time()
    while time.time() - t0 < STALL_S:
        sink = _sink()
        if sink.get("last_voiced", 0.0) > since:
            start = start or sink["voiced_seconds"]
            if sink["voiced_seconds"] - start >= seconds:
                return
        time.sleep(0.1)


# -- roles -------------------------------------------------------------------------------------------------
def mic(node: Node) -> None:
    """mac-aec (examples/mac-aec-chat/mac_aec_simple_segmentation.py): per question speech_started,
    speech_ended, audio_segment (16 kHz float32) with {question_id: int}, then question_ended with the same
    question_id after the end-of-question silence."""
    plan = script()
    driver = {"questions": [], "finished": False}
    wait_ready(plan.get("tts_nodes", 1))
    rng = np.random.default_rng(0)
    for q in plan["questions"]:
        qid = int(q["question_id"])
        t_start = time.time()
        now = time.time()
        node.send_output("speech_started", pa.array([now]))
        node.send_output("is_speaking", pa.array([True]))
        time.sleep(0.3)
        node.send_output("speech_ended", pa.array([time.time()]))
        node.send_output("is_speaking", pa.array([False]))
        segment = (0.05 * rng.standard_normal(8000)).astype(np.float32)
        node.send_output("audio_segment", pa.array(segment, type=pa.float32()), metadata={"question_id": qid})
        log_json(node, "mac-aec", "INFO", f"AUDIO_SEGMENT sent with question_id={qid}")
        time.sleep(1.0)
        node.send_output("question_ended", pa.array([time.time()]), metadata={"question_id": qid})
        entry = {"question_id": qid, "started": t_start}
        if q.get("barge_in_after_s"):
            wait_played(float(q["barge_in_after_s"]), t_start)
            entry["interrupted"] = True
        else:
            entry.update(wait_answered(t_start))
        entry["ended"] = time.time()
        driver["questions"].append(entry)
        write_json(OUT / "driver.json", driver)
    driver["finished"] = True
    write_json(OUT / "driver.json", driver)
    idle(node)


def asr(node: Node) -> None:
    """dora-asr: one transcription per audio segment, the segment's metadata plus session_status ended."""
    by_qid = {str(q["question_id"]): q["transcription"] for q in script()["questions"]}
    for event in node:
        if event["type"] == "STOP":
            break
        if event["type"] != "INPUT" or event["id"] != "audio":
            continue
        md = dict(event["metadata"] or {})
        md.pop("timestamp", None)
        text = by_qid.get(str(md.get("question_id")), "Hello?")
        time.sleep(ASR_DELAY_S)
        md["session_status"] = "ended"
        node.send_output("transcription", pa.array([text]), metadata=md)
        log_json(node, "asr", "INFO", f"Transcribed: {text}")


def _answer_for(plan: dict, text: str, md: dict, participant: str | None = None) -> list[str]:
    for q in plan.get("questions", []):
        if q.get("transcription") == text or str(q.get("question_id")) == str(md.get("question_id")):
            return q["answer"]
    for turn in plan.get("turns", []):
        if turn["participant"] == participant and turn["prompt"] == text:
            return turn["answer"]
    return ["Sorry, I did not get that."]


def llm(node: Node) -> None:
    kind = os.environ.get("LLM_KIND", "maas")
    participant = os.environ.get("PARTICIPANT")
    plan = script()
    for event in node:
        if event["type"] == "STOP":
            break
        if event["type"] != "INPUT" or event["id"] not in ("text", "text_to_audio"):
            continue
        text = event["value"][0].as_py()
        md = dict(event["metadata"] or {})
        md.pop("timestamp", None)
        answer = _answer_for(plan, text, md, participant)
        time.sleep(LLM_DELAY_S)
        if kind == "maas":
            _maas_stream(node, answer, md)
        else:
            _qwen3_stream(node, answer, md)


def _maas_stream(node: Node, answer: list[str], md: dict) -> None:
    """dora-maas-client (src/main.rs, streaming): status processing, each segment with the input's metadata,
    session_status started then ongoing and segment_index as a STRING, then an empty text with
    session_status ended and the next segment_index, status complete."""
    node.send_output("status", pa.array(["processing"]))
    for i, segment in enumerate(answer):
        meta = {**md, "session_status": "started" if i == 0 else "ongoing", "segment_index": str(i)}
        node.send_output("text", pa.array([segment]), metadata=meta)
        time.sleep(0.05)
    node.send_output("status", pa.array(["complete"]))
    node.send_output("text", pa.array([""]), metadata={**md, "session_status": "ended",
                                                       "segment_index": str(len(answer))})


def _qwen3_stream(node: Node, answer: list[str], md: dict) -> None:
    """dora-qwen3 (MLX streaming): chunks with the input's metadata plus is_streaming/is_final, no
    segment_index."""
    for i, segment in enumerate(answer):
        node.send_output("text", pa.array([segment.strip()]),
                         metadata={**md, "is_streaming": True, "is_final": i == len(answer) - 1})
        time.sleep(0.05)
    log_json(node, "qwen3", "INFO", f"answered in {len(answer)} chunks")


def bridge(node: Node) -> None:
    """dora-conference-bridge: forwards the prompt to its participant when the controller resumes it."""
    for event in node:
        if event["type"] == "STOP":
            break
        if event["type"] == "INPUT" and event["id"] == "control":
            md = dict(event["metadata"] or {})
            md.pop("timestamp", None)
            prompt = md.pop("prompt", "Please continue.")
            node.send_output("text", pa.array([prompt]), metadata=md)


CONTROL_OUTPUT = {"tutor": "control_judge", "student1": "control_llm1", "student2": "control_llm2"}


def controller(node: Node) -> None:
    """dora-conference-controller: gives the turns (policy order of the script). Each turn resumes the
    participant's bridge with a question_id; the next turn is given as soon as the participant's answer has
    been generated (its empty ``ended`` marker), so sessions queue in the segmenter (FIFO) while audio plays."""
    plan = script()
    driver = {"turns": [], "finished": False}
    wait_ready(plan.get("tts_nodes", 1))
    t_start = time.time()
    events = iter(node)
    for turn in plan["turns"]:
        meta = {"question_id": str(plan.get("question_id", "1")), "prompt": turn["prompt"]}
        node.send_output(CONTROL_OUTPUT[turn["participant"]], pa.array(["resume"]), metadata=meta)
        t0 = time.time()
        for event in events:
            if event["type"] == "STOP":
                return
            if (event["type"] == "INPUT" and event["id"] == turn["participant"]
                    and (event["metadata"] or {}).get("session_status") == "ended"):
                break
            if time.time() - t0 > STALL_S:
                break
        driver["turns"].append({"participant": turn["participant"], "generated": time.time()})
    driver.update(wait_answered(t_start))
    driver["finished"] = True
    write_json(OUT / "driver.json", driver)
    for event in events:
        if event["type"] == "STOP":
            break


def feeder(node: Node) -> None:
    """A segmenter-like source for flows without one (dora-hub): one text at a time, the next on the TTS
    node's segment_complete."""
    plan = script()
    driver = {"questions": [], "finished": False}
    wait_ready(plan.get("tts_nodes", 1))
    events = iter(node)
    for q in plan["questions"]:
        t_start = time.time()
        for i, text in enumerate(q["answer"]):
            node.send_output("text", pa.array([text]), metadata={"question_id": str(q["question_id"]),
                                                                "session_status": "ongoing", "segment_index": i})
            for event in events:
                if event["type"] == "STOP":
                    return
                if event["type"] == "INPUT" and event["id"] == "segment_complete":
                    break
        entry = {"question_id": q["question_id"], "started": t_start}
        entry.update(wait_answered(t_start))
        driver["questions"].append(entry)
        write_json(OUT / "driver.json", driver)
    driver["finished"] = True
    write_json(OUT / "driver.json", driver)
    idle(node)


def idle(node: Node) -> None:
    for event in node:
        if event["type"] == "STOP":
            break


def _plain(value):
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def probe(node: Node) -> None:
    """Record every input: strings in full, audio as sample count, silence and metadata."""
    path = OUT / f"{os.environ.get('PROBE_NAME', 'probe')}.jsonl"
    with open(path, "a", encoding="utf-8") as f:
        for event in node:
            if event["type"] == "STOP":
                break
            if event["type"] != "INPUT":
                continue
            value = event["value"]
            md = {k: _plain(v) for k, v in (event["metadata"] or {}).items() if k != "timestamp"}
            rec = {"t": time.time(), "input": event["id"], "metadata": md,
                   "metadata_types": {k: type(v).__name__ for k, v in (event["metadata"] or {}).items()}}
            if pa.types.is_string(value.type) or pa.types.is_large_string(value.type):
                rec["value"] = value.to_pylist()
            else:
                if pa.types.is_list(value.type) and len(value):
                    samples = value[0].values.to_numpy(zero_copy_only=False)
                else:
                    samples = value.to_numpy(zero_copy_only=False)
                rec["value_type"] = str(value.type)
                rec["samples"] = int(samples.size)
                rec["nonzero"] = int(np.count_nonzero(samples)) if samples.dtype.kind == "f" else None
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            f.flush()


ROLES = {"mic": mic, "asr": asr, "llm": llm, "bridge": bridge, "controller": controller, "feeder": feeder,
         "idle": idle, "probe": probe}


def main() -> None:
    role = os.environ.get("STANDIN_ROLE", "")
    if role not in ROLES:
        sys.exit(f"STANDIN_ROLE must be one of {sorted(ROLES)}, not {role!r}")
    ROLES[role](Node())


if __name__ == "__main__":
    main()
