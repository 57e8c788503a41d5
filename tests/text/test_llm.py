"""The LLM text stage (text/llm.py) on a corpus of LLM-style answers (tests/text/llm_corpus.jsonl, Chinese and
English: reasoning and tool-call blocks, every markdown form, code, links, URLs, e-mails, emoji, tables, mixed),
whole and cut into messages the way a punctuation segmenter cuts a stream; the stream filter's state rules
(reset, the bound, sessions); hostile inputs."""

from __future__ import annotations

import json
import random
import re
import time
from pathlib import Path

import pytest
from conftest import load_text_data

from dora_primespeech_mlx.text.llm import (
    MAX_BLOCK_CHARS,
    MAX_BLOCK_MESSAGES,
    Sessions,
    StreamFilter,
    clean,
    language_family,
)
from dora_primespeech_mlx.text.speakable import has_speakable

DATA = load_text_data()  # the text front end's folders (tests/conftest.py)

CORPUS = [json.loads(line) for line in Path(__file__).with_name("llm_corpus.jsonl").read_text("utf-8").splitlines()
          if line.strip()]
_ENDS = "。！？.!?…,，、;；:：~～"


def cut(text: str) -> list[str]:
    """Messages as a punctuation segmenter sends them: cut after 。！？, after . ! ? followed by whitespace (not
    inside "3.14", "example.com", "page?x=1" or "![image]"), and at newlines; each trimmed, empty ones not sent."""
    pieces = re.split(r"(?<=[。！？])|(?<=[.!?])(?=\s)|\n", text)
    return [p.strip() for p in pieces if p and p.strip()]


def _sentences(spoken: str) -> str:
    """What the front end speaks, for comparing: every line ends with a mark (the front end ends every text and
    chunk with one; the node speaks each message as a text of its own), whitespace ignored."""
    lines = [ln.strip() for ln in spoken.split("\n") if ln.strip()]
    # a line's closing colon or semicolon is a pause like a comma (the stage writes one where more text follows)
    lines = [ln[:-1] + "," if ln[-1] in ":;：；，、" else ln for ln in lines]
    joined = "".join(ln if ln[-1] in _ENDS else ln + "." for ln in lines)
    return re.sub(r"\s+", "", joined).translate(str.maketrans("。！？，、", ".!?,,"))


def _ws(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def test_corpus_size_and_languages():
    assert len(CORPUS) >= 50
    assert {row["lang"] for row in CORPUS} >= {"zh", "en"}
    assert len({row["id"] for row in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize("row", CORPUS, ids=[r["id"] for r in CORPUS])
def test_corpus_whole(row):
    spoken = clean(row["input"], row["lang"])
    assert _ws(spoken) == _ws(row["expected"])
    assert _ws(clean(row["input"])) == _ws(row["expected"])  # without a hint the text's scripts choose the same
    assert "<" not in spoken or "<" in row["expected"]
    if "\\" not in row["input"]:  # (an escaped "\*" becomes a literal "*", which a second pass would read as markup)
        assert clean(spoken, row["lang"]) == spoken  # what the stage leaves is plain text: a second pass keeps it


@pytest.mark.parametrize("row", [r for r in CORPUS if r.get("stream", True)],
                         ids=[r["id"] for r in CORPUS if r.get("stream", True)])
def test_corpus_streamed(row):
    messages = cut(row["input"])
    for hint in (row["lang"], None):  # the node's filters have no language hint: each message's scripts decide
        f = StreamFilter(hint)
        spoken = [f.feed(m) for m in messages]
        assert _sentences("\n".join(spoken)) == _sentences(row["expected"]), (hint, list(zip(messages, spoken)))
        # the node answers a message with nothing speakable as skipped: markup and reasoning alone say nothing
        for m, s in zip(messages, spoken):
            if not has_speakable(s):
                assert s.strip() == "", (m, s)


def test_corpus_covers_every_form():
    text = "\n".join(r["input"] for r in CORPUS)
    for form in ("<think>", "<thinking>", "<reasoning>", "</think>", "<tool_call>", "<function_call>", "```", "~~~",
                 "`", "**", "__", "~~", "# ", "- ", "* ", "+ ", "1. ", "> ", "---", "|---", "[^1]", "](http",
                 "![", "http", "www.", "@example", "<br>", "&amp;", "\\*", "😊", "✅"):
        assert form in text, form


def test_think_block_over_three_messages():
    f = StreamFilter("zh")
    assert f.feed("<think>我需要想一想。") == "" and f.in_block == "think"
    assert f.feed("用户在问天气。") == "" and f.in_block == "think"
    assert f.feed("</think>今天天气很好。") == "今天天气很好。" and f.in_block is None
    assert f.feed("明天也不错。") == "明天也不错。"


def test_code_fence_and_tool_call_across_messages():
    f = StreamFilter("en")
    assert f.feed("Here you go:") == "Here you go:"
    assert f.feed("```python") == "" and f.in_block == "code"
    assert f.feed('print("hello. world!")') == ""
    assert f.feed("```") == "" and f.in_block is None
    assert f.feed("<tool_call>") == "" and f.in_block == "tool"
    assert f.feed('{"name": "lookup"}') == ""
    assert f.feed("</tool_call> Done.") == "Done."


def test_reset_and_new_question_clear_an_open_block():
    f = StreamFilter()
    f.feed("<think>")
    f.reset()
    assert f.in_block is None and f.feed("Hello there.") == "Hello there."
    sessions = Sessions()
    s = sessions.get("demo", "1")
    s.feed("<think>still thinking.")
    assert sessions.get("demo", "1") is s and s.in_block == "think"
    assert sessions.get("demo", "2").feed("New question.") == "New question."  # a new question: a new filter
    other = sessions.get("other", "1")
    assert other.feed("Independent.") == "Independent."
    s2 = sessions.get("demo", "2")
    s2.feed("```")
    sessions.reset()
    assert sessions.get("demo", "2").in_block is None


def test_bound_closes_a_block_left_open():
    f = StreamFilter("en")
    f.feed("<think>")
    for _ in range(MAX_BLOCK_MESSAGES - 1):
        assert f.feed("Still reasoning.") == ""
    assert f.in_block == "think" and f.overflows == 0
    assert f.feed("The answer.") == "The answer."  # message MAX_BLOCK_MESSAGES + 1: the block was closed
    assert f.overflows == 1 and f.in_block is None
    g = StreamFilter("en")
    g.feed("```")
    assert g.feed("x" * MAX_BLOCK_CHARS) == ""
    assert g.feed("Spoken again.") == "Spoken again." and g.overflows == 1


def test_sessions_are_bounded():
    sessions = Sessions(max_sessions=4)
    for i in range(100):
        sessions.get(f"s{i}", "q").feed("<think>")
    assert len(sessions._filters) == 4


def test_language_family_and_marks():
    assert language_family("all_zh") == "zh" and language_family("auto", "안녕") == "ko"
    assert language_family(None, "こんにちは") == "ja" and language_family(None, "hello") == "en"
    assert language_family("auto_yue", "你好") == "yue"
    assert clean("## 标题\n正文") == "标题。\n正文"
    assert clean("## Title\nBody") == "Title.\nBody"
    assert clean("- 項目\n- 二つ目", "ja") == "項目。\n二つ目"
    # Korean e-mails are left to the Korean front end (it reads them as words); URLs are read as domains
    assert clean("메일은 test@example.com 입니다.", "ko") == "메일은 test@example.com 입니다."
    assert clean("사이트는 https://example.com 입니다.", "ko") == "사이트는 example 닷 com 입니다."


LIST_ROWS = [r for r in CORPUS if r["id"].startswith("list-")]
_PAUSES = ",.!?。！？，、…"


def test_list_corpus_covers_every_list_form_in_three_languages():
    assert {r["lang"] for r in LIST_ROWS} >= {"zh", "en", "ja", "ko", "yue"}
    text = "\n".join(r["input"] for r in LIST_ROWS if r["lang"] in ("zh", "en", "ja"))
    for form in ("\n1. ", "\n1) ", "\n- ", "\n* ", "\n+ ", "\n   - ", "**Step 1:**", "\n# ", "\n## ", "|---|",
                 "- [ ] ", "**注意：**"):
        assert form in text, form


@pytest.mark.parametrize("row", LIST_ROWS, ids=[r["id"] for r in LIST_ROWS])
def test_list_items_are_phrases_of_their_own(row):
    """Each line that more text follows ends with a mark every front end reads as a pause (the front ends drop
    line breaks: "need:" + "two eggs" was read "needtwo eggs"), and no list number is left to be read as an
    ordinal ("1. " is "first, " to the English front end)."""
    spoken = clean(row["input"], row["lang"])
    lines = [ln.strip() for ln in spoken.split("\n") if ln.strip()]
    assert len(lines) == len([ln for ln in row["input"].split("\n") if re.search(r"\w", re.sub(r"[-|:]", "", ln))])
    for line, following in zip(lines, lines[1:]):
        assert line[-1] in _PAUSES, (line, following)
        assert not re.match(r"\d{1,3}[.)]\s", following), following
    f = StreamFilter(row["lang"])
    streamed = [f.feed(m) for m in row["input"].split("\n")]  # a line per message: the node's segmenters
    assert _sentences("\n".join(streamed)) == _sentences(spoken)


@pytest.mark.parametrize("row", [r for r in LIST_ROWS if r["lang"] in ("zh", "en")],
                         ids=[r["id"] for r in LIST_ROWS if r["lang"] in ("zh", "en")])
def test_list_items_read_apart_by_the_front_end(row):
    """Through the front end: no ordinal, and a pause between each item's last word and the next one's first."""
    from dora_primespeech_mlx.text import get_phones

    norm = get_phones(clean(row["input"], row["lang"]), row["lang"], data=DATA).norm_text
    assert not re.search(r"\b(first|second|third)\b", norm, re.IGNORECASE), norm
    lines = [ln.strip() for ln in clean(row["input"], row["lang"]).split("\n") if ln.strip()]
    for line, following in zip(lines, lines[1:]):
        last = re.findall(r"[A-Za-z]+|[\u4e00-\u9fff]", line)[-1]
        first = re.findall(r"[A-Za-z]+|[\u4e00-\u9fff]", following)[0]
        assert not re.search(re.escape(last) + r"\s*" + re.escape(first), norm), (last, first, norm)


def test_a_line_start_number_is_a_list_marker():
    assert clean("1. First item 2. Second item") == "First item 2. Second item"
    assert clean("2) Restart the server") == "Restart the server"


@pytest.mark.parametrize("text", [
    "3 * 4 * 5 = 60", "a_b_c and snake_case", "C# and F#", "x < y > z", "if a<b and c>d then", "#hashtag# here",
    "^_^ and ~_~", "50% off * terms apply", "2**10 is 1024", "Price: $5 | $6",
    "e.g. example.com without a scheme", "The <think> tag names reasoning.", "~~~ is a tilde fence",
])
def test_prose_that_looks_like_markup_is_kept(text):
    cleaned = clean(text, "en")
    kept = re.sub(r"\s+", "", cleaned)
    assert len(kept) >= len(re.sub(r"\s+", "", text)) - len("<think>"), cleaned
    if "<think>" not in text:
        assert cleaned == text


@pytest.mark.parametrize("payload", [
    "", "\n\n\n", "<think>" * 1000, "</think>" * 1000, "```" * 1000, "`" * 5000, "*" * 5000, "_" * 5000,
    "[" * 3000 + "]" * 3000, "[a](" * 2000, "<b " * 2000, "&#" * 3000, "&#x110000;", "&#0;", "\ue000\ue100 text",
    "\ud800 lone surrogate", "|" * 4000, "|---|" * 1000, "http://" + "a." * 3000, "a@" * 3000 + "b.com",
    "👍" * 3000, "\u200d" * 3000, "> " * 3000, "#" * 5000 + " x", "- " * 3000, "\x00\x01\x02", "\r\n\r\n",
])
def test_hostile_inputs(payload):
    t0 = time.perf_counter()
    out = clean(payload)
    f = StreamFilter()
    for piece in (payload[:100], payload, payload[::-1]):
        assert isinstance(f.feed(piece), str)
    assert isinstance(out, str) and len(out) <= len(payload) * 4 + 16
    assert time.perf_counter() - t0 < 5.0, "a pathological input made the stage slow"


def test_random_markup_soup_terminates_and_is_stable():
    rng = random.Random(7)
    atoms = ["<think>", "</think>", "```", "~~~", "**", "*", "_", "`", "[", "](", ")", "|", "\n", "# ", "- ", "> ",
             "http://x.io/a", "a@b.com", "你好", "hello", "。", ".", " ", "😊", "<tool_call>", "</tool_call>", "&amp;"]
    for _ in range(300):
        text = "".join(rng.choice(atoms) for _ in range(rng.randint(1, 60)))
        once = clean(text)
        assert isinstance(once, str)
        f = StreamFilter()
        for m in cut(text):
            assert isinstance(f.feed(m), str)


def test_non_str_is_refused():
    with pytest.raises(TypeError):
        StreamFilter().feed(b"bytes")  # type: ignore[arg-type]


def test_cli_phones_shows_the_spoken_text(capsys, monkeypatch):
    from dora_primespeech_mlx.cli import main

    text = "<think>让我想想</think>**你好**，访问 https://example.com/a?b=c 获取更多。"
    monkeypatch.delenv("PRIMESPEECH_LLM_TEXT", raising=False)
    assert main(["phones", text, "--lang", "zh"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["text"] == text and out["spoken_text"] == "你好，访问 example 点 com 获取更多。"
    assert "think" not in out["norm_text"] and "http" not in out["norm_text"] and "你好" in out["norm_text"]
    for argv, env in ((["phones", text, "--lang", "zh", "--raw"], None), (["phones", text, "--lang", "zh"], "false")):
        if env is not None:
            monkeypatch.setenv("PRIMESPEECH_LLM_TEXT", env)
        assert main(argv) == 0
        raw = json.loads(capsys.readouterr().out)
        assert "spoken_text" not in raw and "think" in raw["norm_text"]  # the original's reading of the raw text
    monkeypatch.delenv("PRIMESPEECH_LLM_TEXT")
    assert main(["phones", "```\nprint(1)\n```", "--lang", "zh"]) == 2
    assert "nothing to speak" in capsys.readouterr().err
