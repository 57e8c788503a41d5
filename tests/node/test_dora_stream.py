"""In a real ``dora run`` (node form, fixture voice): an LLM stand-in (tests/node/llm_standin.py) streams an answer
with a reasoning block and a numbered list as fragments of 2-5 characters at 30 per second (dora's streaming
convention: ``session_id``, ``segment_id``, ``seq``, ``fin``). The node speaks it sentence by sentence, each
sentence's samples equal to that sentence sent whole, with one ``segment_complete`` for the utterance and audio
numbered by ``seq`` with ``fin`` on the last chunk. Halfway through a second answer the stand-in starts a third
with ``flush: true``: no audio of the second is sent later than 100 ms after the flush, a real downstream node
(tests/node/stream_sink.py) gets the next ``audio`` with ``flush: true`` and nothing of the old answer after it,
and the new answer is spoken. The same in the operator form (with a heartbeat input)."""

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

from dora_primespeech_mlx.text.llm import clean

pytestmark = pytest.mark.dora

HERE = Path(__file__).parent
ANSWER = ("<think>The user asks how to restart the server. I will list the steps.</think>"
          "Restarting is easy. Here are the steps:\n1. Stop the server.\n2. Start it again.\nThat is all you need.")
SENTENCES = ["Restarting is easy.", "Here are the steps:", "1. Stop the server.", "2. Start it again.",
             "That is all you need."]
# its second sentence is long (seconds of synthesis), so the flush that follows its start finds it being made
INTERRUPTED = ("Once upon a time there was a small server. One day a user asked it to speak much more slowly than "
               "usual, and the server, which had never been asked such a thing, thought about it for a long while, "
               "then it answered with a very long story about its many friends, its old days, and the rooms it had "
               "lived in. " + "It talked and talked. Nobody listened to it. " * 8)
BARGE_IN = "Sorry, I will stop. What would you like to know?"
STOP_WITHIN_S = 0.1


def flow(tmp: Path, model_dir: Path, operator: bool = False) -> Path:
    env = {"VOICE_NAME": VOICE, "PRIMESPEECH_MODEL_DIR": str(model_dir), "GPTSVITS_WARMUP": "false", "TOP_K": "1",
           "LOG_LEVEL": "INFO", "NLTK_DATA": os.environ.get("NLTK_DATA", str(REPO.parent / "shared" / "nltk_data")),
           "PRIMESPEECH_TEXT_DATA": os.environ.get("PRIMESPEECH_TEXT_DATA",
                                                   str(REPO.parent / "shared" / "data" / "gpt-sovits-text"))}

    def wired(*sources):
        return {s.split("/")[1]: {"source": s, "queue_size": 1000} for s in sources}

    outputs = ["audio", "segment_complete", "status", "log"]
    if operator:  # its heartbeat input lets a barge-in through while a text is being spoken
        tts = {"id": "tts", "env": env, "operator": {"python": str(REPO / "dora_primespeech_mlx" / "node.py"),
                                                     "inputs": {**wired("llm/text"), "tick": "dora/timer/millis/50"},
                                                     "outputs": outputs}}
    else:
        tts = {"id": "tts", "path": "dora-primespeech-mlx", "inputs": wired("llm/text"), "outputs": outputs, "env": env}
    nodes = [
        {"id": "llm", "path": f"{sys.executable}", "args": str(HERE / "llm_standin.py"),
         "inputs": wired("tts/segment_complete", "tts/status"), "outputs": ["text", "done"],
         "env": {"PLAN_FILE": str(tmp / "plan.json")}},
        tts,
        {"id": "sink", "path": f"{sys.executable}", "args": str(HERE / "stream_sink.py"),
         "inputs": wired("tts/audio", "tts/segment_complete", "tts/status", "llm/text", "llm/done"),
         "env": {"OUTPUT_DIR": str(tmp / "out")}},
    ]
    (tmp / "plan.json").write_text(json.dumps({"answer": ANSWER, "sentences": SENTENCES, "interrupted": INTERRUPTED,
                                               "barge_in": BARGE_IN}), encoding="utf-8")
    path = tmp / "dataflow.yaml"
    path.write_text(yaml.safe_dump({"nodes": nodes}, allow_unicode=True), encoding="utf-8")
    return path


@pytest.mark.parametrize("operator", [False, True], ids=["node", "operator"])
def test_token_stream_is_spoken_by_sentence_and_a_barge_in_stops_it(tmp_path, operator):
    rc, _, output, elapsed = run_yaml(tmp_path, flow(tmp_path, make_model_dir(tmp_path / "models"), operator),
                                      timeout=400)
    assert rc == 0, tail(output)
    report = tmp_path / "out" / "report.json"
    assert report.exists(), tail(output)
    events = json.loads(report.read_text(encoding="utf-8"))
    md = [e["metadata"] for e in events]

    def of(input_id, **keys):
        return [e for e, m in zip(events, md) if e["input"] == input_id and all(m.get(k) == v for k, v in keys.items())]

    def samples(event):
        return np.load(tmp_path / "out" / event["file"])

    # one answer per utterance and per whole text; fragments get none
    answers = of("segment_complete")
    assert len(answers) == 3 + len(SENTENCES), [(e["value"], e["metadata"]) for e in answers]
    (first,) = of("segment_complete", segment_id=1)
    assert first["value"] == "completed" and first["metadata"]["session_id"] == "chat"

    # segment 1: sentence by sentence, each equal to the sentence given whole; seq 0.., fin on the last
    spoken = of("audio", segment_id=1)
    assert [e["metadata"]["seq"] for e in spoken] == list(range(len(SENTENCES)))
    assert [e["metadata"]["fin"] for e in spoken] == [False] * (len(SENTENCES) - 1) + [True]
    chars = [s for s in of("status", segment_id=1) if json.loads(s["value"])["status"] == "synthesizing"]
    # (the LLM stage drops the list numbers: a sentence is spoken as its whole text is)
    assert [json.loads(s["value"])["characters"] for s in chars] == [len(clean(s, "en")) for s in SENTENCES]
    for k, event in enumerate(spoken):
        (whole,) = of("audio", question_id=f"whole{k}")
        assert np.array_equal(samples(event), samples(whole)), SENTENCES[k]

    # the barge-in: the first audio of the new answer carries flush, nothing old comes after it
    (flush_msg,) = [e for e in of("text", segment_id=3) if e["metadata"].get("flush") is True]
    flushed_at = flush_msg["metadata"]["timestamp"]
    old = of("audio", segment_id=2)
    assert old, "segment 2 was being spoken when the flush came"
    late = [e["metadata"]["timestamp"] - flushed_at for e in old if e["metadata"]["timestamp"] > flushed_at]
    new = of("audio", segment_id=3)
    assert new[0]["metadata"].get("flush") is True and [e["metadata"].get("flush") for e in new[1:]] == [None]
    assert sum(e["metadata"].get("flush") is True for e in of("audio")) == 1
    at = events.index(new[0])
    assert not [e for e in events[at:] if e["input"] == "audio" and e["metadata"].get("segment_id") == 2]
    assert new[-1]["metadata"]["fin"] is True  # its two sentences
    (second,) = of("segment_complete", segment_id=2)
    assert second["value"] == "error" and second["metadata"]["error_stage"] == "flush"
    (third,) = of("segment_complete", segment_id=3)
    assert third["value"] == "completed"
    (status,) = [s for s in of("status") if json.loads(s["value"])["status"] == "flush"]
    assert json.loads(status["value"])["cancelled"] == 1
    print(f"token stream under dora ({'operator' if operator else 'node'}): {elapsed:.1f} s; old audio sent "
          f"after the flush: {[round(d, 3) for d in late]} s")
    if operator:
        return  # an operator runs only inside the runtime's on_event: the flush reaches it behind queued events
    # the node form: no old audio leaves later than 100 ms after the flush, and the sentence being made was cut
    assert all(d <= STOP_WITHIN_S for d in late), late
    assert audio_after_flush_starts_new(events, flushed_at)
    bodies = [json.loads(s["value"]) for s in of("status", segment_id=2)]
    started = {b["sentence"] for b in bodies if b["status"] == "synthesizing"}
    finished = {b["sentence"] for b in bodies if b["status"] == "done"}
    assert started - finished, (started, finished)


def audio_after_flush_starts_new(events, flushed_at) -> bool:
    """The first audio sent after the flush message is the new answer's, marked flush."""
    after = [e for e in events if e["input"] == "audio" and e["metadata"]["timestamp"] > flushed_at]
    return bool(after) and after[0]["metadata"].get("flush") is True and after[0]["metadata"]["segment_id"] == 3
