"""In a real ``dora run`` (node form, fixture voices), whole and streamed (``STREAMING``): a conversation stand-in
(tests/node/session_standin.py) and a recorder (tests/node/stream_sink.py).

- Each chunk's ``text``/``text_start`` tile what it speaks: an LLM token stream's chunks its spoken
  text (the answer's words), a plain text's chunks its text exactly; for an English text, and for a Chinese and a
  mixed one where the fixture set's BERT is the GPT's 1024 wide (with a narrower one the node cannot speak
  Chinese; tests/node/test_spans.py covers those languages with a random 1024-wide BERT).
- Two sessions on one node, two voices: ``room2``'s plain texts interleave with ``room1``'s streamed answer; a
  ``cancel`` of ``room1`` stops it (answered once, with what went out) and ``room2``'s audio arrives complete and
  in order, never marked ``flush``; ``stats`` counts both sessions."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO
from test_dora import run_yaml, tail
from tiny_voice import VOICE, make_model_dir

pytestmark = pytest.mark.dora

HERE = Path(__file__).parent
TEXTS = {
    "en": "Hello there, how are you today? I am fine, thanks. See you soon!",
    "zh": "今天天气很好，我们去公园散步吧。公园里有很多花！明天见。",
    "auto": "我们今天用 Python 写代码。It is a lot of fun, right? 好的，明天见！",
}
ROOM1 = " ".join(f"Room one, sentence {n}: the story goes on for quite a while here." for n in range(1, 13))
ROOM2 = ["Room two speaks first.", "Room two speaks again, after a pause.", "And room two ends, with a last word."]


def squeeze(s: str) -> str:
    return re.sub(r"\s+", "", s)


def models(root: Path) -> tuple[Path, list[str]]:
    """The tiny voices, one per language of :data:`TEXTS` the fixture BERT can speak, and a second English one
    (``Tiny en two``). Returns the folder and those languages."""
    root = make_model_dir(root)
    base = yaml.safe_load((root / "voices" / VOICE / "voice.yaml").read_text(encoding="utf-8"))
    wide = json.loads((Path(base["bert"]) / "config.json").read_text(encoding="utf-8"))["hidden_size"] == 1024
    langs = ["en", "zh", "auto"] if wide else ["en"]
    for name, lang, speed in [*[(f"Tiny {lang}", lang, 1.0) for lang in langs], ("Tiny en two", "en", 1.25)]:
        (root / "voices" / name).mkdir()
        data = {**base, "name": name, "language": lang, "speed_factor": speed}
        (root / "voices" / name / "voice.yaml").write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return root, langs


def flow(tmp: Path, streaming: str) -> tuple[Path, list[str]]:
    model_dir, langs = models(tmp / "models")
    env = {"VOICE_NAME": "Tiny en", "PRIMESPEECH_MODEL_DIR": str(model_dir), "GPTSVITS_WARMUP": "false",
           "TOP_K": "1", "LOG_LEVEL": "INFO", "STREAMING": streaming,
           "NLTK_DATA": os.environ.get("NLTK_DATA", str(REPO.parent / "shared" / "nltk_data")),
           "PRIMESPEECH_TEXT_DATA": os.environ.get("PRIMESPEECH_TEXT_DATA",
                                                   str(REPO.parent / "shared" / "data" / "gpt-sovits-text"))}

    def wired(*sources):
        return {s.split("/")[1]: {"source": s, "queue_size": 1000} for s in sources}

    nodes = [
        {"id": "llm", "path": f"{sys.executable}", "args": str(HERE / "session_standin.py"),
         "inputs": wired("tts/segment_complete", "tts/status"), "outputs": ["text", "control", "done"],
         "env": {"PLAN_FILE": str(tmp / "plan.json")}},
        {"id": "tts", "path": "dora-primespeech-mlx", "inputs": wired("llm/text", "llm/control"),
         "outputs": ["audio", "segment_complete", "status", "log"], "env": env},
        {"id": "sink", "path": f"{sys.executable}", "args": str(HERE / "stream_sink.py"),
         "inputs": wired("tts/audio", "tts/segment_complete", "tts/status", "llm/control", "llm/done"),
         "env": {"OUTPUT_DIR": str(tmp / "out")}},
    ]
    plan = {"texts": [{"voice": f"Tiny {lang}", "lang": lang, "text": TEXTS[lang]} for lang in langs],
            "room1": ROOM1, "room1_voice": "Tiny en", "room2": ROOM2, "room2_voice": "Tiny en two"}
    (tmp / "plan.json").write_text(json.dumps(plan, ensure_ascii=False), encoding="utf-8")
    path = tmp / "dataflow.yaml"
    path.write_text(yaml.safe_dump({"nodes": nodes}, allow_unicode=True), encoding="utf-8")
    return path, langs


def tiles(chunks: list[dict]) -> str:
    """The chunks' spans start at 0 and each starts where the one before it ended; their texts joined."""
    assert chunks, "no audio"
    at = 0
    for md in chunks:
        assert md["text_start"] == at and "text_end" not in md, (at, md)
        at += len(md["text"])
    return "".join(md["text"] for md in chunks)


@pytest.mark.parametrize("streaming", ["false", "true"])
def test_chunks_carry_their_text_and_a_session_cancel_leaves_the_other_session_speaking(tmp_path, streaming):
    path, langs = flow(tmp_path, streaming)
    rc, _, output, elapsed = run_yaml(tmp_path, path, timeout=400)
    assert rc == 0, tail(output)
    report = tmp_path / "out" / "report.json"
    assert report.exists(), tail(output)
    events = json.loads(report.read_text(encoding="utf-8"))

    def of(input_id, **keys):
        return [e["metadata"] for e in events
                if e["input"] == input_id and all(e["metadata"].get(k) == v for k, v in keys.items())]

    def answer(**keys):
        (e,) = [e for e in events if e["input"] == "segment_complete"
                and all(e["metadata"].get(k) == v for k, v in keys.items())]
        return e["value"], e["metadata"]

    # what each chunk speaks: tiles of the utterance's spoken text, and of a plain text exactly
    for k, lang in enumerate(langs):
        assert answer(session_id="spans", segment_id=k)[0] == "completed", lang
        assert answer(session_id="spans", question_id=f"plain{k}")[0] == "completed", lang
        streamed = of("audio", session_id="spans", segment_id=k)
        assert squeeze(tiles(streamed)) == squeeze(TEXTS[lang]), lang
        plain = of("audio", session_id="spans", question_id=f"plain{k}")
        assert tiles(plain) == TEXTS[lang], lang
        if streaming == "false":  # one audio message per sentence of the utterance, one for the plain text
            assert len(plain) == 1 and len(streamed) >= 3 and all(m["text"].strip() for m in streamed)

    # room1 was cancelled: answered once, with what went out
    value, md = answer(session_id="room1", segment_id=1)
    assert value == "error" and md["error_stage"] == "cancel", md
    sent = of("audio", session_id="room1")
    joined = tiles(sent) if sent else ""
    spoken = md["spoken_text"]
    assert squeeze(ROOM1).startswith(squeeze(spoken)) and joined.startswith(spoken)
    assert not spoken or spoken.rstrip().endswith(".")
    assert len(squeeze(joined)) < len(squeeze(ROOM1)), "room1 was cut short"
    assert md["audio_sent_s"] == pytest.approx(sum(m["duration"] for m in sent), abs=2e-3)
    if "cut_text" in md:
        assert joined[md["cut_start"]:] == md["cut_sent_text"] and md["cut_text"].startswith(md["cut_sent_text"])
    (cancel_msg,) = [m for m in of("control") if m.get("session_id") == "room1"]
    late = [m["timestamp"] - cancel_msg["timestamp"] for m in sent if m["timestamp"] > cancel_msg["timestamp"]]
    assert all(d < 0.25 for d in late), late

    # room2: every text complete, in order, with its own voice; nothing marked flush
    audio2 = of("audio", session_id="room2")
    assert [m["question_id"] for m in audio2] == sorted((m["question_id"] for m in audio2), key=lambda q: int(q[3:]))
    for n, text in enumerate(ROOM2):
        assert answer(session_id="room2", question_id=f"r2-{n}")[0] == "completed"
        chunks = [m for m in audio2 if m["question_id"] == f"r2-{n}"]
        assert tiles(chunks) == text and chunks[-1]["is_final"] is True
        assert {m["voice"] for m in chunks} == {"Tiny en two"}
    assert not [m for m in of("audio") if m.get("flush")]
    # the session's cancel was answered on status; stats counts both sessions
    bodies = [json.loads(e["value"]) for e in events if e["input"] == "status"]
    (cancel,) = [b for b in bodies if b["status"] == "cancel"]
    assert cancel["session"] == "room1" and cancel["cancelled"] == 1
    (stats,) = [b for b in bodies if b["status"] == "stats"]
    sessions = stats["sessions"]
    assert sessions["room1"]["cancelled"] == 1 and sessions["room1"]["completed"] == 0
    assert sessions["room2"]["completed"] == len(ROOM2) and sessions["room2"]["audio_s"] > 0
    print(f"sessions under dora (STREAMING={streaming}, {', '.join(langs)}): {elapsed:.1f} s; room1 cut after "
          f"{md['audio_sent_s']} s of audio, spoken {len(spoken)} characters; late audio {late}")
