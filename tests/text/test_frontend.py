"""The text front end pipeline against upstream GPT-SoVITS v2, for every case of text/cases_v2.jsonl.

Per case: the language split (segments' lang/text, independent of the G2P), then get_phones
(phone ids, phones, norm_text, word2ph, every segment, retried_with_dot), preprocess for every
recorded method (pre_seg_text, every chunk's input/norm_text/phones/phone_ids and whether it is
kept), and the reference-text path. Cases where upstream raised must raise TextFrontendError.
"""

from __future__ import annotations

import re

import pytest
from conftest import load_jsonl, param_or_missing, require_case

from dora_primespeech_mlx.text import (
    TextFrontendError,
    UnsupportedLanguageError,
    get_phones,
    phones_json,
    preprocess,
    prompt_phones,
    split_languages,
    split_text,
)
from dora_primespeech_mlx.text.frontend import clean_text

CASES = "text/cases_v2.jsonl"
_ROWS = load_jsonl(CASES)
_PARAMS = param_or_missing(_ROWS, lambda row: row["id"], CASES)
_PRE_ROWS = [(row, rec) for row in _ROWS for rec in row.get("preprocess", [])]


def _as_list(x):
    return None if x is None else list(x)


@pytest.mark.parametrize("row", _PARAMS)
def test_language_split(row):
    """Segments as upstream's LangSegmenter + option merging builds them (no G2P involved)."""
    row = require_case(row, CASES)
    text = re.sub(" {2,}", " ", row["text"])
    if "error" in row:
        if row["language"] != "en":
            with pytest.raises(TextFrontendError):
                split_languages(text, row["language"])
        return
    if row["retried_with_dot"]:
        text = "." + text
    expected = [(s["lang"], s["text"]) for s in row["segments"]]
    assert split_languages(text, row["language"]) == expected


@pytest.mark.parametrize("row", _PARAMS)
def test_get_phones(row):
    row = require_case(row, CASES)
    if "error" in row:
        with pytest.raises(TextFrontendError):
            get_phones(row["text"], row["language"])
        return
    result = get_phones(row["text"], row["language"])
    got_segments = [
        {
            "lang": s.lang,
            "text": s.text,
            "norm_text": s.norm_text,
            "phones": list(s.phones),
            "word2ph": _as_list(s.word2ph),
            "phone_ids": list(s.phone_ids),
        }
        for s in result.segments
    ]
    assert got_segments == row["segments"]
    assert result.norm_text == row["norm_text"]
    assert list(result.phones) == row["phones"]
    assert list(result.phone_ids) == row["phone_ids"]
    assert _as_list(result.word2ph) == row["word2ph"]
    assert result.retried_with_dot == row["retried_with_dot"]
    assert result.text == row["text"]


@pytest.mark.parametrize(
    "item", param_or_missing(_PRE_ROWS, lambda it: f"{it[0]['id']}-{it[1]['method']}", CASES)
)
def test_preprocess(item):
    row, rec = require_case(item, CASES)
    if "error" in rec:
        with pytest.raises(TextFrontendError):
            preprocess(row["text"], row["language"], rec["method"])
        return
    assert split_text(row["text"], rec["method"], row["language"]) == rec["pre_seg_text"]
    assert [c["input"] for c in rec["chunks"]] == rec["pre_seg_text"]
    chunks = preprocess(row["text"], row["language"], rec["method"])
    kept = [c for c in rec["chunks"] if c["kept"]]
    assert [c.text for c in chunks] == [c["input"] for c in kept]
    for got, want in zip(chunks, kept):
        assert got.norm_text == want["norm_text"]
        assert list(got.phones) == want["phones"]
        assert list(got.phone_ids) == want["phone_ids"]
    for dropped in (c for c in rec["chunks"] if not c["kept"]):
        assert get_phones(dropped["input"], row["language"]).norm_text == ""


@pytest.mark.parametrize("row", _PARAMS)
def test_prompt(row):
    row = require_case(row, CASES)
    want = row["as_prompt"]
    if "error" in want:
        with pytest.raises(TextFrontendError):
            prompt_phones(row["text"], row["language"])
        return
    result = prompt_phones(row["text"], row["language"])
    if "skipped" in want:
        assert result is None
        return
    assert result is not None
    assert result.text == want["input"]
    assert result.norm_text == want["norm_text"]
    assert list(result.phones) == want["phones"]
    assert list(result.phone_ids) == want["phone_ids"]


# ------------------------------------------------------------------------------ rules and errors


@pytest.mark.parametrize("option", ["ja", "ko", "yue", "all_ja", "all_ko", "all_yue", "auto_yue", "fr", ""])
def test_unsupported_options(option):
    for fn in (
        lambda: get_phones("你好，世界。", option),
        lambda: preprocess("你好，世界。", option),
        lambda: prompt_phones("你好，世界。", option),
    ):
        with pytest.raises(UnsupportedLanguageError, match=f"language {option!r} is not supported yet"):
            fn()


@pytest.mark.parametrize("text", ["こんにちは、世界。", "你好，안녕하세요。"])
def test_auto_refuses_japanese_and_korean(text):
    with pytest.raises(UnsupportedLanguageError, match="not supported yet"):
        split_languages(text, "auto")
    # with a Chinese option the same text is read as Chinese (kana/hangul are dropped by normalisation)
    assert {lang for lang, _ in split_languages(text, "zh")} == {"zh"}
    assert {lang for lang, _ in split_languages(text, "all_zh")} == {"zh"}


def test_unsupported_segment_language():
    for lang in ("ja", "ko", "yue"):
        with pytest.raises(UnsupportedLanguageError):
            clean_text("あ", lang)


def test_upstream_examples():
    assert split_languages("iPhone 15 Pro", "all_zh") == [("en", "iPhone "), ("zh", "15 "), ("en", "Pro")]
    assert split_languages("Hello world", "all_zh") == [("en", "Hello world")]
    assert split_languages("  a  \n", "en") == [("en", "  a  \n")]
    for option in ("all_zh", "zh", "auto"):
        for blank in ("", " ", "\n\t "):
            with pytest.raises(TextFrontendError):
                split_languages(blank, option)


def test_non_str_input():
    with pytest.raises(TextFrontendError, match="str"):
        get_phones(None, "zh")  # type: ignore[arg-type]
    with pytest.raises(TextFrontendError, match="str"):
        preprocess(b"abc", "zh")  # type: ignore[arg-type]


def test_phones_json_matches_get_phones():
    text = "我用ChatGPT写了3个程序。"
    out = phones_json(text, "zh", method="cut5")
    result = get_phones(text, "zh")
    assert out["phone_ids"] == list(result.phone_ids)
    assert [s["lang"] for s in out["segments"]] == [s.lang for s in result.segments]
    assert [c["input"] for c in out["preprocess"]["chunks"]] == split_text(text, "cut5", "zh")


def test_long_run_without_punctuation():
    """Upstream's split_big_text yields an empty first chunk for a > 510-character run without split
    marks; a Chinese option then fails (as upstream does), English phonemises the empty chunk."""
    with pytest.raises(TextFrontendError, match="without a split mark"):
        preprocess("字" * 600, "zh", "cut5")
    chunks = preprocess("a" * 600, "en", "cut5")
    assert [c.text for c in chunks] == ["", "a" * 600, "."]
