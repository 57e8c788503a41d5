"""The node's LLM text stage (PRIMESPEECH_LLM_TEXT) with a fake engine: one stream filter per session and
question, reasoning/tool-call/code blocks over several messages answered ``skipped``, the engine given the cleaned
text (and told not to clean it again), ``reset`` and a new question clearing an open block, the setting off
passing raw text."""

from __future__ import annotations

import pyarrow as pa
from test_reliability import FakeEngine, make


class TextEngine(FakeEngine):
    def __init__(self):
        super().__init__()
        self.texts: list[tuple[str, dict]] = []

    def synthesize(self, text, voice=None, cancel=None, **kw):
        self.texts.append((text, kw))
        return super().synthesize(text, voice, cancel, **kw)


def _send(handler, rec, messages, session="demo", question="1"):
    before = len(rec.of("segment_complete"))
    for m in messages:
        handler.on_input("text", pa.array([m]), {"session_id": session, "question_id": question})
    rec.wait(lambda r: len(r.of("segment_complete")) == before + len(messages))
    return [a[0].as_py() for a, _ in rec.of("segment_complete")[before:]]


def test_blocks_across_messages_are_skipped_and_prose_is_spoken_clean():
    engine = TextEngine()
    handler, rec = make(engine)
    try:
        outcomes = _send(handler, rec, [
            "<think>The user asks about the weather.",
            "I should call the tool.</think>",
            "<tool_call>",
            '{"name": "get_weather", "arguments": {"city": "Paris"}}',  # JSON inside an open block: not a payload
            "</tool_call>",
            "**It is sunny** in [Paris](https://paris.example.com).",
            "```python",
            "print('not spoken.')",
            "```",
            "- 🎉 Enjoy!",
        ])
        assert outcomes == ["skipped"] * 5 + ["completed"] + ["skipped"] * 3 + ["completed"]
        assert [t for t, _ in engine.texts] == ["It is sunny in Paris.", "Enjoy!"]
        assert all(kw.get("llm_text") is False for _, kw in engine.texts)  # cleaned once, in the node
    finally:
        handler.stop()


def test_new_question_and_reset_clear_an_open_block():
    engine = TextEngine()
    handler, rec = make(engine)
    try:
        assert _send(handler, rec, ["<think>unfinished thought."], question="1") == ["skipped"]
        assert _send(handler, rec, ["A new answer."], question="2") == ["completed"]
        assert _send(handler, rec, ["```"], question="2") == ["skipped"]
        assert _send(handler, rec, ["still code."], question="2") == ["skipped"]
        handler.on_input("reset", None, {})
        assert _send(handler, rec, ["After the reset."], question="2") == ["completed"]
        # sessions are independent: an open block in one does not silence another
        assert _send(handler, rec, ["<think>"], session="a") == ["skipped"]
        assert _send(handler, rec, ["Session b speaks."], session="b") == ["completed"]
        assert [t for t, _ in engine.texts] == ["A new answer.", "After the reset.", "Session b speaks."]
    finally:
        handler.stop()


def test_setting_off_passes_raw_text():
    engine = TextEngine()
    handler, rec = make(engine, PRIMESPEECH_LLM_TEXT="false")
    try:
        raw = "<think>reasoning</think>**Hi** there."
        assert _send(handler, rec, [raw]) == ["completed"]
        assert engine.texts == [(raw, {"llm_text": False})]  # the node owns the stage: the engine never runs it
        # an unparsable JSON payload stays an error when no block is open
        assert _send(handler, rec, ['{"name": "x"}']) == ["error"]
    finally:
        handler.stop()


def test_json_without_an_open_block_is_still_an_input_error():
    engine = TextEngine()
    handler, rec = make(engine)
    try:
        assert _send(handler, rec, ['{"name": "x"}']) == ["error"]
        assert _send(handler, rec, ['{"prompt": "<think>no</think>Yes."}']) == ["completed"]
        assert engine.texts[-1][0] == "Yes."
    finally:
        handler.stop()
