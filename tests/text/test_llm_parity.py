"""The LLM text stage (text/llm.py) is a no-op on plain text: every fixture sentence (text/cases_v2.jsonl,
text/cases_v2_jkc.jsonl, text/splits.jsonl, whichever fixture set PRIMESPEECH_FIXTURES names) without the marks
the stage acts on comes back unchanged and gives upstream's phone ids through the stage and the front end (the
quick tier: a sample of rows; --full: every row), for the whole-text path (get_phones) and every recorded
preprocess method. A sentence with such marks (a URL, an e-mail address, a line-start list number, markdown
marks, emoji: :func:`may_change`) may be rewritten, as the stage documents, and is then checked against the
stage's other rules only."""

from __future__ import annotations

import importlib.util
import re
import unicodedata

import pytest
from conftest import case_rows, fixtures_required, load_jsonl, load_text_data, require_case

from dora_primespeech_mlx.text import TextFrontendError, get_phones, preprocess, split_text
from dora_primespeech_mlx.text.llm import StreamFilter, clean

DATA = load_text_data()  # the text front end's folders (tests/conftest.py)

CASE_FILES = ("text/cases_v2.jsonl", "text/cases_v2_jkc.jsonl")
SPLITS = "text/splits.jsonl"
_OPTION_EXTRA = {"all_ja": "ja", "ja": "ja", "all_ko": "ko", "ko": "ko", "all_yue": "yue", "yue": "yue"}
_EXTRA_MODULES = {"ja": ("pyopenjtalk",), "ko": ("g2pk2", "mecab", "jamo"), "yue": ("ToJyutping",)}


# what the stage acts on, from its documentation (not from its code): markdown and HTML marks, URLs, e-mail
# addresses, line-start markers (bullets, list numbers, quotes, rules)
_MARKUP_RE = re.compile(r"[`*_~#|\[\]<>&\\@]|://|www\.|^[ \t]*(?:[-+>=]|\d{1,3}[.)])", re.MULTILINE | re.IGNORECASE)


def may_change(text: str) -> bool:
    """Whether the stage may rewrite ``text``: it holds a mark the stage acts on, or an emoji."""
    return bool(_MARKUP_RE.search(text)) or any(
        unicodedata.category(ch) == "So" or ch in "\u200d\ufe0f\u20e3" for ch in text)


def test_may_change_finds_what_the_stage_rewrites():
    for text in ("网址：www.example.com，邮箱：test@example.com。", "1. First item", "**粗体**", "Go 👍", "<b>x</b>"):
        assert may_change(text), text
    for text in ("今天天气很好。", "Hello, world! It's 3.5 degrees.", "こんにちは。", "안녕하세요."):
        assert not may_change(text), text


def _params(rows=load_jsonl):
    """Every row of each case file (``rows=case_rows``: the quick tier's sample, every row under ``--full``)."""
    params = []
    for path in CASE_FILES:
        mine = [pytest.param(row, id=row["id"]) for row in rows(path)]
        params += mine or [pytest.param(None, id=f"missing:{path}")]
    return params


def _need_extra(row) -> None:
    extra = _OPTION_EXTRA.get(row["language"])
    absent = [m for m in _EXTRA_MODULES.get(extra, ()) if importlib.util.find_spec(m) is None]
    if absent:
        msg = f"the {extra!r} extra is not installed ({', '.join(absent)} missing)"
        if fixtures_required():
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)


@pytest.mark.parametrize("row", _params())
def test_fixture_sentence_is_untouched(row):
    row = require_case(row, "text/cases_v2.jsonl")
    text, lang = row["text"], row["language"]
    for hint in (lang, None):
        cleaned = clean(text, hint)
        if not may_change(text):
            assert cleaned == text, hint
        assert StreamFilter(hint).feed(text) == cleaned  # one message: the stream filter says the same


@pytest.mark.parametrize("row", _params(case_rows))
def test_fixture_phones_through_the_stage(row):
    row = require_case(row, "text/cases_v2.jsonl")
    _need_extra(row)
    text, lang = row["text"], row["language"]
    cleaned = clean(text, lang)
    if cleaned != text:
        assert may_change(text), cleaned
        pytest.skip("the stage rewrites this sentence (it documents how): upstream's phones are of the raw text")
    if "error" in row:
        with pytest.raises(TextFrontendError):
            get_phones(cleaned, lang, data=DATA)
        return
    assert list(get_phones(cleaned, lang, data=DATA).phone_ids) == row["phone_ids"], cleaned
    for rec in row.get("preprocess", []):
        if "chunks" not in rec:  # upstream raised
            with pytest.raises(TextFrontendError):
                preprocess(cleaned, lang, rec["method"], data=DATA)
            continue
        chunks = preprocess(cleaned, lang, rec["method"], data=DATA)
        kept = [c for c in rec["chunks"] if c.get("norm_text")]
        assert [list(c.phone_ids) for c in chunks] == [c["phone_ids"] for c in kept], rec["method"]


def test_fixture_paragraphs_are_untouched():
    rows = load_jsonl(SPLITS)
    if not rows:
        require_case(None, SPLITS)
    for row in rows:
        cleaned = clean(row["text"], row["language"])
        if cleaned != row["text"]:
            assert may_change(row["text"]), row["id"]
            continue
        for method, rec in row["methods"].items():
            assert split_text(cleaned, method, row["language"]) == rec["pre_seg_text"], (row["id"], method)
