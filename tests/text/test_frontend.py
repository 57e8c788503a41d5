"""The text front end pipeline against upstream GPT-SoVITS v2, for every case of text/cases_v2.jsonl
(Chinese, English, auto) and text/cases_v2_jkc.jsonl (Japanese, Korean, Cantonese).

Per case: the language split (segments' lang/text, independent of the G2P), then get_phones
(phone ids, phones, norm_text, word2ph, every segment, retried_with_dot), preprocess for every
recorded method (pre_seg_text, every chunk's input/norm_text/phones/phone_ids and whether it is
kept), and the reference-text path. Cases where upstream raised must raise TextFrontendError.

The Japanese, Korean and Cantonese front ends need their pip extras (part of ``dev``); without one,
its cases skip with the reason (fail with PRIMESPEECH_REQUIRE_FIXTURES=1, as in CI).
"""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest
from conftest import case_rows, fixtures_required, load_text_data, require_case

from dora_primespeech_mlx.text import (
    TextFrontendError,
    UnsupportedLanguageError,
    cantonese,
    get_phones,
    japanese,
    korean,
    phones_json,
    preprocess,
    prompt_phones,
    split_languages,
    split_text,
)
from dora_primespeech_mlx.text.errors import MissingExtraError
from dora_primespeech_mlx.text.frontend import clean_text

DATA = load_text_data()  # the text front end's folders (tests/conftest.py)

CASES = "text/cases_v2.jsonl"
CASES_JKC = "text/cases_v2_jkc.jsonl"
CASE_FILES = (CASES, CASES_JKC)
_ROWS = [(path, row) for path in CASE_FILES for row in case_rows(path)]
_PRE_ROWS = [(path, row, rec) for path, row in _ROWS for rec in row.get("preprocess", [])]

# language option -> (pip extra, modules it provides) for the options that need one
_OPTION_EXTRA = {"all_ja": "ja", "ja": "ja", "all_ko": "ko", "ko": "ko", "all_yue": "yue", "yue": "yue"}
_EXTRA_MODULES = {"ja": ("pyopenjtalk",), "ko": ("g2pk2", "mecab", "jamo"), "yue": ("ToJyutping",)}


def _params(items, ids):
    params = []
    for path in CASE_FILES:
        mine = [pytest.param(it, id=ids(it)) for it in items if it[0] == path]
        params += mine or [pytest.param((path, None), id=f"missing:{path}")]
    return params


def _case(item):
    """The fixture row (and record) of a parameter; skips (fails in CI) for a missing file or pip extra."""
    path, row = item[0], item[1]
    if row is None:
        require_case(None, path)
    extra = _OPTION_EXTRA.get(row["language"])
    if extra:
        absent = [m for m in _EXTRA_MODULES[extra] if importlib.util.find_spec(m) is None]
        if absent:
            msg = f"the {extra!r} extra is not installed ({', '.join(absent)} missing): pip install -e '.[{extra}]'"
            if fixtures_required():
                pytest.fail(msg, pytrace=False)
            pytest.skip(msg)
    return (row, item[2]) if len(item) > 2 else row


def _row_id(item):
    return item[1]["id"]


_PARAMS = _params(_ROWS, _row_id)


def _as_list(x):
    return None if x is None else list(x)


@pytest.mark.parametrize("row", _PARAMS)
def test_language_split(row):
    """Segments as upstream's LangSegmenter + option merging builds them (no G2P involved)."""
    row = _case(row)
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
    row = _case(row)
    if "error" in row:
        with pytest.raises(TextFrontendError):
            get_phones(row["text"], row["language"], data=DATA)
        return
    result = get_phones(row["text"], row["language"], data=DATA)
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


@pytest.mark.parametrize("item", _params(_PRE_ROWS, lambda it: f"{it[1]['id']}-{it[2]['method']}"))
def test_preprocess(item):
    row, rec = _case(item)
    if "error" in rec:
        with pytest.raises(TextFrontendError):
            preprocess(row["text"], row["language"], rec["method"], data=DATA)
        return
    assert split_text(row["text"], rec["method"], row["language"]) == rec["pre_seg_text"]
    assert [c["input"] for c in rec["chunks"]] == rec["pre_seg_text"]
    chunks = preprocess(row["text"], row["language"], rec["method"], data=DATA)
    kept = [c for c in rec["chunks"] if c["kept"]]
    assert [c.text for c in chunks] == [c["input"] for c in kept]
    for got, want in zip(chunks, kept):
        assert got.norm_text == want["norm_text"]
        assert list(got.phones) == want["phones"]
        assert list(got.phone_ids) == want["phone_ids"]
    for dropped in (c for c in rec["chunks"] if not c["kept"]):
        assert get_phones(dropped["input"], row["language"], data=DATA).norm_text == ""


@pytest.mark.parametrize("row", _PARAMS)
def test_prompt(row):
    row = _case(row)
    want = row["as_prompt"]
    if "error" in want:
        with pytest.raises(TextFrontendError):
            prompt_phones(row["text"], row["language"], data=DATA)
        return
    result = prompt_phones(row["text"], row["language"], data=DATA)
    if "skipped" in want:
        assert result is None
        return
    assert result is not None
    assert result.text == want["input"]
    assert result.norm_text == want["norm_text"]
    assert list(result.phones) == want["phones"]
    assert list(result.phone_ids) == want["phone_ids"]


# ------------------------------------------------------------------------------ rules and errors


@pytest.mark.parametrize("option", ["fr", "", "ZH", "all_en", "auto_ja", "cantonese"])
def test_unsupported_options(option):
    for fn in (
        lambda: get_phones("你好，世界。", option, data=DATA),
        lambda: preprocess("你好，世界。", option, data=DATA),
        lambda: prompt_phones("你好，世界。", option, data=DATA),
    ):
        with pytest.raises(UnsupportedLanguageError, match=f"language {option!r} is not supported"):
            fn()


def test_auto_routes_by_script():
    """auto (and auto_yue) send kana text to Japanese, Hangul to Korean, Han to Chinese (Cantonese)."""
    assert split_languages("こんにちは、ありがとう。", "auto") == [("ja", "こんにちは、ありがとう。")]
    assert split_languages("こんにちは、世界。", "auto")[0] == ("ja", "こんにちは、")  # "世界。": zh by script
    assert split_languages("你好，안녕하세요。", "auto") == [("zh", "你好，"), ("ko", "안녕하세요。")]
    assert split_languages("你好，안녕하세요。", "auto_yue") == [("yue", "你好，"), ("ko", "안녕하세요。")]
    mixed = get_phones("今日はいい天気ですね。你好，안녕하세요。Hello!", "auto", data=DATA)
    assert [s.lang for s in mixed.segments] == ["ja", "zh", "ko", "en"]
    for seg in mixed.segments:
        assert list(seg.phones) == clean_text(seg.text, seg.lang, data=DATA)[0]
    # with a Chinese option the same text is read as Chinese (kana/hangul are dropped by normalisation)
    for text in ("こんにちは、世界。", "你好，안녕하세요。"):
        assert {lang for lang, _ in split_languages(text, "zh")} == {"zh"}
        assert {lang for lang, _ in split_languages(text, "all_zh")} == {"zh"}


_MISSING = [  # (segment language, front-end module, its cached library, library module, sample text)
    ("ja", japanese, "_pyopenjtalk", "pyopenjtalk", "日本語です。"),
    ("ko", korean, "_runtime", "jamo", "안녕하세요"),
    ("yue", cantonese, "_tojyutping", "ToJyutping", "你好。"),
]


@pytest.mark.parametrize(("lang", "frontend", "attr", "library", "text"), _MISSING, ids=[m[0] for m in _MISSING])
def test_missing_extra_names_it(monkeypatch, lang, frontend, attr, library, text):
    """Without its library a language fails with MissingExtraError naming the pip extra."""
    monkeypatch.setattr(frontend, attr, None)
    monkeypatch.setitem(sys.modules, library, None)  # "import library" now raises ImportError
    with pytest.raises(MissingExtraError, match=rf"pip install 'dora-primespeech-mlx\[{lang}\]'"):
        clean_text(text, lang, data=DATA)


def test_upstream_examples():
    assert split_languages("iPhone 15 Pro", "all_zh") == [("en", "iPhone "), ("zh", "15 "), ("en", "Pro")]
    assert split_languages("Hello world", "all_zh") == [("en", "Hello world")]
    assert split_languages("  a  \n", "en") == [("en", "  a  \n")]
    for option in ("all_zh", "zh", "auto", "all_ja", "ja", "all_ko", "ko", "all_yue", "yue", "auto_yue"):
        for blank in ("", " ", "\n\t "):
            with pytest.raises(TextFrontendError):
                split_languages(blank, option)


def test_non_str_input():
    with pytest.raises(TextFrontendError, match="str"):
        get_phones(None, "zh", data=DATA)  # type: ignore[arg-type]
    with pytest.raises(TextFrontendError, match="str"):
        preprocess(b"abc", "zh", data=DATA)  # type: ignore[arg-type]


def test_phones_json_matches_get_phones():
    text = "我用ChatGPT写了3个程序。"
    out = phones_json(text, "zh", method="cut5", data=DATA)
    result = get_phones(text, "zh", data=DATA)
    assert out["phone_ids"] == list(result.phone_ids)
    assert [s["lang"] for s in out["segments"]] == [s.lang for s in result.segments]
    assert [c["input"] for c in out["preprocess"]["chunks"]] == split_text(text, "cut5", "zh")


@pytest.mark.parametrize("text,language", [("字" * 600, "zh"), ("a" * 600, "en"), ("a" * 4800, "en"),
                                           ("你好。" + "字" * 600, "zh"), ("Hi. " + "ab" * 300, "en"),
                                           ("あ" * 600, "ja"), ("한" * 600, "ko"), ("字" * 600, "yue")])
def test_long_run_without_punctuation(text, language):
    """A run of more than 510 characters without split marks is refused in every language and wherever it
    stands (upstream's split_big_text yields an empty first chunk and then the whole run: Chinese failed on the
    empty chunk, English read a 4 800-letter "word" for 28 s and +800 MB)."""
    with pytest.raises(TextFrontendError, match="without a split mark"):
        preprocess(text, language, "cut5", data=DATA)


def test_an_overlong_word_is_refused():
    """A 100-letter "word" (no dictionary has it) is refused instead of running the neural predictor for seconds."""
    with pytest.raises(TextFrontendError, match="up to 64"):
        preprocess("Say " + "qwrtzp" * 17 + " now.", "en", "cut5", data=DATA)


class _Stop(Exception):
    pass


@pytest.mark.parametrize("text,language", [("Hello world. How are you today? Fine.", "en"),
                                           ("今天天气很好。我们去公园散步吧。", "zh")])
def test_checkpoints_stop_the_front_end_with_the_callers_exception(text, language):
    """The engine's check (cancel, MAX_TEXT_SECONDS) runs between chunks, segments, words and sentences; what it
    raises leaves the front end unchanged (not wrapped in TextFrontendError)."""
    from dora_primespeech_mlx.text.budget import checks

    calls = []

    def check():
        calls.append(1)
        if len(calls) >= 3:
            raise _Stop("stop")

    with checks(check), pytest.raises(_Stop):
        preprocess(text, language, "cut5", data=DATA)
    assert preprocess(text, language, "cut5", data=DATA)  # outside the block: no checks
