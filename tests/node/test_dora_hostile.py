"""In a real ``dora run`` (node form, fixture voice), a hostile or careless token-stream sender
(tests/node/hostile_sender.py, issue 50): a ``<think>`` block open across the idle end of its utterance is never
spoken (form 1); a barge-in stamped 2100-01-01 mutes nothing, and a fragment stamped before a barge-in is answered
as cancelled (form 2); ``seq: -1`` loses no utterance (form 3); 1 500 one-character "。" fragments delay another
session's text by less than 2 s beyond that text's own time alone, measured in the same run (form 5); a 1 MB
fragment is answered with an error naming its limit (form 4). Each gets one answer; a real downstream node
(tests/node/stream_sink.py) records the audio."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import REPO
from test_dora import run_yaml, tail
from tiny_voice import VOICE, make_model_dir

from dora_primespeech_mlx.dataflow.cancellation import FLUSHED

pytestmark = pytest.mark.dora

HERE = Path(__file__).parent
IDLE_S = 0.5
MAX_EXTRA_S = 2.0  # another session's text: at most this much later than alone


def flow(tmp: Path, model_dir: Path) -> Path:
    env = {"VOICE_NAME": VOICE, "PRIMESPEECH_MODEL_DIR": str(model_dir), "GPTSVITS_WARMUP": "false", "TOP_K": "1",
           "LOG_LEVEL": "INFO", "PRIMESPEECH_SEGMENT_IDLE_S": str(IDLE_S),
           "NLTK_DATA": os.environ.get("NLTK_DATA", str(REPO.parent / "shared" / "nltk_data")),
           "PRIMESPEECH_TEXT_DATA": os.environ.get("PRIMESPEECH_TEXT_DATA",
                                                   str(REPO.parent / "shared" / "data" / "gpt-sovits-text"))}

    def wired(*sources):
        return {s.split("/")[1]: {"source": s, "queue_size": 4000} for s in sources}

    nodes = [
        {"id": "llm", "path": f"{sys.executable}", "args": str(HERE / "hostile_sender.py"),
         "inputs": wired("tts/segment_complete", "tts/status"), "outputs": ["text", "control"],
         "env": {"RESULT_FILE": str(tmp / "sender.json"), "IDLE_S": str(IDLE_S)}},
        {"id": "tts", "path": "dora-primespeech-mlx", "inputs": wired("llm/text", "llm/control"),
         "outputs": ["audio", "segment_complete", "status", "log"], "env": env},
        {"id": "sink", "path": f"{sys.executable}", "args": str(HERE / "stream_sink.py"),
         "inputs": wired("tts/audio", "tts/status"), "env": {"OUTPUT_DIR": str(tmp / "out")}},
    ]
    path = tmp / "dataflow.yaml"
    path.write_text(yaml.safe_dump({"nodes": nodes}, allow_unicode=True), encoding="utf-8")
    return path


def test_a_hostile_token_stream_is_answered_once_each_and_speaks_no_reasoning(tmp_path):
    rc, _, output, elapsed = run_yaml(tmp_path, flow(tmp_path, make_model_dir(tmp_path / "models")), timeout=400)
    assert rc == 0, tail(output)
    assert (tmp_path / "sender.json").exists(), tail(output)
    sent = json.loads((tmp_path / "sender.json").read_text(encoding="utf-8"))
    events = json.loads((tmp_path / "out" / "report.json").read_text(encoding="utf-8"))

    def answers(**keys):
        return [(a["value"], a["metadata"]) for a in sent["answers"]
                if all(a["metadata"].get(k) == v for k, v in keys.items())]

    def audio(**keys):
        return [np.load(tmp_path / "out" / e["file"]) for e in events if e["input"] == "audio"
                and not e["metadata"].get("silent") and all(e["metadata"].get(k) == v for k, v in keys.items())]

    # form 1: the reasoning utterance (ended by the idle wait) is skipped; the answer is the plain sentence's audio
    assert [v for v, _ in answers(session_id="think")] == ["skipped", "completed"], answers(session_id="think")
    (spoken,) = audio(session_id="think")
    (whole,) = audio(question_id="whole")
    assert np.array_equal(spoken, whole)
    synthesized = [(e["metadata"].get("session_id"), e["metadata"].get("question_id")) for e in events
                   if e["input"] == "status" and json.loads(e["value"]).get("status") == "synthesizing"]
    # one synthesis per text that has words: whole, alone x2, think, neg, after-future, during (no reasoning)
    assert len(synthesized) == 7, (synthesized, tmp_path)
    # form 3
    assert [v for v, _ in answers(session_id="neg")] == ["completed"]
    # form 2
    assert [v for v, _ in answers(question_id="after-future")] == ["completed"]
    ((late, late_md),) = answers(session_id="late")
    assert late == "error" and late_md["error"] == FLUSHED
    # form 5: the run of end marks is one utterance with nothing to speak; the other session is not held up
    assert [v for v, _ in answers(session_id="marks")] == ["skipped"]
    assert sent["during"] < sent["alone"] + MAX_EXTRA_S, (sent["during"], sent["alone"])
    # form 4
    ((big, big_md),) = answers(session_id="big")
    assert big == "error" and "PRIMESPEECH_MAX_FRAGMENT_CHARS" in big_md["error"]
    assert len(sent["answers"]) == 11  # whole, alone x2, think x2, neg, after-future, late, marks, during, big
    print(f"hostile stream under dora: {elapsed:.1f} s; another session's text alone {sent['alone']:.2f} s, behind "
          f"1 500 end marks {sent['during']:.2f} s")
