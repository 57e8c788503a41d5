"""The LLM stage on a text that arrives in fragments cut anywhere (an LLM's token stream: 2-5 characters at a
time): ``StreamFilter.feed_fragment`` for each fragment, then ``flush``.

The guarantee, for every text and every way of cutting it: the concatenation of what the fragments return and
what ``flush`` returns EQUALS what ``feed_fragment(text) + flush()`` returns (the filter cuts the text into
messages by the text alone). And it SPEAKS THE SAME as ``clean(text)``: the same sentences with the same marks
once every line is ended with a mark, as the node speaks each message as a text of its own (test_llm's
``_sentences``), for every corpus answer that a stream can say (not the ones whose reasoning closer has no opener:
what came before it is spoken before the closer arrives)."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_llm import CORPUS, _sentences

from dora_primespeech_mlx.text.llm import StreamFilter, clean

ATOMS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "```", "```python", "~~~", "`", "**", "*", "_", "__",
         "~~", "[", "](", ")", "(", "|", "|---|", "\n", "\n\n", "# ", "## ", "- ", "* ", "+ ", "1. ", "2) ", "> ",
         "http://x.io/a.b", "www.example.com", "a@b.com", "你好", "世界", "hello", "world", "。", "！", ".", "!", "?",
         ":", "：", " ", "  ", "😊", "&amp;", "<b>", "</b>", "<br>", "<!--", "-->", "3.14", "e.g.", "<th", "ink>",
         "**Step 1:**", "| a | b |", "こんにちは", "안녕"]
texts = st.lists(st.sampled_from(ATOMS), max_size=40).map("".join)
FRAGMENTS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                     derandomize=True)


def in_one_piece(text: str, hint: str | None = None) -> str:
    f = StreamFilter(hint)
    return f.feed_fragment(text) + f.flush()


def in_pieces(pieces: list[str], hint: str | None = None) -> str:
    f = StreamFilter(hint)
    return "".join(f.feed_fragment(p) for p in pieces) + f.flush()


def cut_at(text: str, cuts: list[int]) -> list[str]:
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


@FRAGMENTS
@given(text=texts, cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30))
def test_any_cut_gives_the_same_spoken_text(text, cuts):
    assert in_pieces(cut_at(text, cuts)) == in_one_piece(text)


@FRAGMENTS
@given(text=texts, seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_token_sized_fragments_give_the_same_spoken_text(text, seed):
    rng, pieces, i = random.Random(seed), [], 0
    while i < len(text):
        n = rng.randint(2, 5)
        pieces.append(text[i:i + n])
        i += n
    assert in_pieces(pieces) == in_one_piece(text)


@pytest.mark.parametrize("text, cut", [
    ("Hello wonderful world. Bye", "Hello wonder"),  # inside a word
    ("Visit https://example.com/a.b?c=d now. Thanks", "Visit https://exam"),  # inside a URL
    ("Steps:\n1. Open the app.\n2. Tap Settings", "Steps:\n1"),  # inside a list marker
    ("Steps:\n1. Open the app.\n2. Tap Settings", "Steps:\n1."),
    ("<think>hidden. still hidden</think>Spoken.", "<th"),  # inside a think tag
    ("Run:\n```python\nx = 1. y\n```\nDone.", "Run:\n``"),  # inside a code fence
    ("It is **very. important** now.", "It is *"),  # inside a markdown mark
    ("好的。\n**注意：** 保持网络畅通。", "好的。\n**注"),
])
def test_named_cuts(text, cut):
    assert text.startswith(cut)
    one = in_one_piece(text)
    assert in_pieces([cut, text[len(cut):]]) == one
    assert in_pieces(list(text)) == one  # a character at a time
    assert _sentences(one) == _sentences(clean(text))
    assert "hidden" not in one and "x = 1" not in one and "**" not in one and "http" not in one


STREAMABLE = [r for r in CORPUS if r.get("stream", True)]


@pytest.mark.parametrize("row", STREAMABLE, ids=[r["id"] for r in STREAMABLE])
def test_corpus_in_fragments_speaks_as_the_whole(row):
    rng = random.Random(row["id"])
    pieces, i, text = [], 0, row["input"]
    while i < len(text):
        n = rng.randint(2, 5)
        pieces.append(text[i:i + n])
        i += n
    for hint in (row["lang"], None):
        spoken = in_pieces(pieces, hint)
        assert spoken == in_one_piece(text, hint)
        assert _sentences(spoken) == _sentences(row["expected"]), (hint, spoken)


def test_every_returned_line_ends_with_a_pause():
    """Each message comes back ended with a mark and a line break: the node may speak the returns one by one
    or joined, and no word glues to the next one's first."""
    f = StreamFilter("en")
    out = [f.feed_fragment(p) for p in ("You will", " need:\n- two", " eggs\n- a cu", "p of milk")] + [f.flush()]
    assert out == ["", "You will need,\n", "two eggs.\n", "", "a cup of milk.\n"]


def test_feed_fragment_refuses_non_str():
    with pytest.raises(TypeError):
        StreamFilter().feed_fragment(b"x")  # type: ignore[arg-type]
