"""Text cutting (cut0…cut5, pre_seg_text) against upstream, for every paragraph of text/splits.jsonl
and the pre_seg_text of every preprocessing record of text/cases_v2.jsonl."""

from __future__ import annotations

import pytest
from conftest import case_rows, param_or_missing, require_case

from dora_primespeech_mlx.text.errors import TextFrontendError
from dora_primespeech_mlx.text.segmentation import (
    get_method,
    merge_short_text_in_array,
    replace_consecutive_punctuation,
    split_big_text,
    split_text,
)

SPLITS = "text/splits.jsonl"
CASES = "text/cases_v2.jsonl"

_SPLIT_ROWS = [
    (row, name, rec) for row in case_rows(SPLITS) for name, rec in sorted(row["methods"].items())
]
_CASE_ROWS = [(row, rec) for row in case_rows(CASES) for rec in row.get("preprocess", [])]


def _split_id(item):
    row, name, _ = item
    return f"{row.get('id', row['text'][:12])}-{name}"


@pytest.mark.parametrize("item", param_or_missing(_SPLIT_ROWS, _split_id, SPLITS))
def test_cut_method_raw(item):
    row, name, rec = require_case(item, SPLITS)
    method = get_method(name)
    if "raw_error" in rec:
        with pytest.raises(TextFrontendError):
            method(row["text"])
    else:
        assert method(row["text"]) == rec["raw"]


@pytest.mark.parametrize("item", param_or_missing(_SPLIT_ROWS, _split_id, SPLITS))
def test_pre_seg_text(item):
    row, name, rec = require_case(item, SPLITS)
    if "pre_seg_text_error" in rec:
        with pytest.raises(TextFrontendError):
            split_text(row["text"], name, row["language"])
    else:
        assert split_text(row["text"], name, row["language"]) == rec["pre_seg_text"]


@pytest.mark.parametrize(
    "item", param_or_missing(_CASE_ROWS, lambda it: f"{it[0]['id']}-{it[1]['method']}", CASES)
)
def test_pre_seg_text_of_cases(item):
    row, rec = require_case(item, CASES)
    if "error" in rec:
        with pytest.raises(TextFrontendError):
            split_text(row["text"], rec["method"], row["language"])
    else:
        assert split_text(row["text"], rec["method"], row["language"]) == rec["pre_seg_text"]


def test_unknown_method():
    with pytest.raises(TextFrontendError, match="cut9"):
        get_method("cut9")


def test_rules():
    assert replace_consecutive_punctuation("好!!!?？…,.--") == "好!？…"
    assert merge_short_text_in_array(["a", "bc", "def", "gh"], 5) == ["abcdefgh"]
    assert merge_short_text_in_array(["abcde", "f", "ghijk"], 5) == ["abcde", "fghijk"]
    assert merge_short_text_in_array(["ab", "cde", "f"], 5) == ["abcdef"]
    assert merge_short_text_in_array(["abc"], 5) == ["abc"]
    # split_big_text keeps upstream's quirk: an over-long first piece yields an empty first chunk
    long = "字" * 600
    assert split_big_text(long + "。") == ["", long, "。"]
    # a leading "。" for a short first clause, "." for English
    assert split_text("好的，走吧", "cut0", "zh") == ["。好的，走吧。"]
    assert split_text("OK, go", "cut0", "en") == [".OK, go."]


def test_long_input_is_linear():
    import time

    text = "这是一个测试句子，" * 20000  # 180 000 characters
    start = time.perf_counter()
    for method in ("cut0", "cut1", "cut2", "cut3", "cut4", "cut5"):
        chunks = split_text(text, method, "zh")
        assert all(len(c) <= 510 for c in chunks)
        assert "".join(chunks) == text
    assert time.perf_counter() - start < 20
