"""In a real ``dora run`` (node form, fixture voice): a reasoning block streamed over three ``text`` messages is
not spoken (each answered ``skipped`` with its silent audio), the answer after it is spoken exactly like the same
sentence sent as plain text, and markdown in a message is spoken as its words."""

from __future__ import annotations

import pytest
from test_dora import NODE_FORM, audio_of, by_status, check_one_answer_per_text, run_flow, tail

pytestmark = [pytest.mark.slow, pytest.mark.dora]

ANSWER = "Hello there, nice to meet you."
THINK = [
    "<think>The user greets me, so I should greet them back.",
    "I could also mention the weather, which is sunny today.",
    "Keep it short.</think>",
]
MARKDOWN = "- **Hello there**, nice to meet you."


def test_think_block_over_three_messages_is_not_spoken(tmp_path):
    script = "\n".join([*THINK, ANSWER, "", ANSWER, "", MARKDOWN]) + "\n"
    rc, report, output, elapsed = run_flow(tmp_path, script, NODE_FORM)
    assert rc == 0, tail(output)
    assert report is not None, tail(output)
    segments = check_one_answer_per_text(report, output)
    outcome = {(s["question_id"], s["text"]): s["outcome"] for s in segments}
    for message in THINK:
        assert outcome[("1", message)] == "skipped", message
        seg = next(s for s in segments if s["text"] == message)
        chunks = audio_of(report, seg)
        assert len(chunks) == 1 and chunks[0]["silent"] is True  # SILENCE_ON_SKIP, nothing spoken
    assert outcome[("1", ANSWER)] == "completed"
    assert outcome[("2", ANSWER)] == "completed"
    assert outcome[("3", MARKDOWN)] == "completed"

    def spoken(question, text):
        seg = next(s for s in segments if s["question_id"] == question and s["text"] == text)
        (chunk,) = audio_of(report, seg)
        return chunk["duration"]

    # the answer after the reasoning is the same audio as the plain sentence (TOP_K=1, the default seed): the
    # reasoning reached neither the text nor the GPT's context; the markdown item is spoken as its words
    assert spoken("1", ANSWER) == pytest.approx(spoken("2", ANSWER), abs=1e-6)
    assert spoken("3", MARKDOWN) == pytest.approx(spoken("2", ANSWER), abs=1e-6)
    # the node reports the spoken text's length when it starts synthesising: the cleaned text's
    sizes = [s["body"]["characters"] for s in by_status(report, "synthesizing")]
    assert sizes == [len(ANSWER)] * 3, sizes
    print(f"LLM text under dora: dora run took {elapsed:.1f} s")
