"""Chinese front end (text_normalize + g2p) against the original GPT-SoVITS v2 output.

The fixtures (text/cases_v2.jsonl) were made with upstream's ``is_g2pw = False`` branch, which is
this package's default. Every Chinese segment of every case is checked, plus every preprocessing
chunk and reference-text prompt of a Chinese case that the pipeline sends whole to the Chinese front
end (no ASCII letters, so the language splitter returns a single ``zh`` segment).
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from conftest import case_rows, load_text_data, param_or_missing, require_case

from dora_primespeech_mlx.settings import Settings
from dora_primespeech_mlx.text import chinese
from dora_primespeech_mlx.text.chinese import g2p, text_normalize
from dora_primespeech_mlx.text.errors import TextFrontendError
from dora_primespeech_mlx.text.options import TextData

DATA = load_text_data()  # the text front end's folders (tests/conftest.py)

CASES = "text/cases_v2.jsonl"
_ROWS = case_rows(CASES)

# upstream cleaner.clean_text: a Chinese segment containing one of these is normalised with the
# symbol replaced by "," and then every "," phone becomes the pause symbol (first match wins).
_SPECIAL = (("￥", "SP2"), ("^", "SP3"))


def clean_zh(text: str) -> tuple[str, list[str], list[int]]:
    """What upstream's ``clean_text(text, "zh", "v2")`` does, composed from this module."""
    for symbol, pause in _SPECIAL:
        if symbol in text:
            norm = text_normalize(text.replace(symbol, ","))
            phones, word2ph = g2p(norm, data=DATA)
            return norm, [pause if p == "," else p for p in phones], word2ph
    norm = text_normalize(text)
    phones, word2ph = g2p(norm, data=DATA)
    return norm, phones, word2ph


def _zh_segments() -> list[tuple[str, int, dict]]:
    return [
        (row["id"], i, seg) for row in _ROWS for i, seg in enumerate(row.get("segments") or []) if seg["lang"] == "zh"
    ]


@pytest.mark.parametrize("item", param_or_missing(_zh_segments(), lambda it: f"{it[0]}-seg{it[1]}", CASES))
def test_zh_segment_matches_reference(item):
    _, _, seg = require_case(item, CASES)
    norm, phones, word2ph = clean_zh(seg["text"])
    assert norm == seg["norm_text"]
    assert phones == seg["phones"]
    assert word2ph == seg["word2ph"]
    assert len(word2ph) == len(norm) and sum(word2ph) == len(phones)


def _whole_zh_inputs() -> list[tuple[str, str, dict]]:
    """Chunks/prompts of Chinese cases that reach the Chinese front end as one segment."""
    items = []
    for row in _ROWS:
        if row["language"] not in {"zh", "all_zh"}:
            continue
        candidates = [(p["method"], c) for p in row.get("preprocess", []) if "error" not in p for c in p["chunks"]]
        prompt = row.get("as_prompt") or {}
        if "phones" in prompt:
            candidates.append(("prompt", prompt))
        for j, (where, chunk) in enumerate(candidates):
            text = chunk["input"]
            if text.strip() and not re.search("[A-Za-z]", text):
                items.append((row["id"], f"{where}{j}", chunk))
    return items


@pytest.mark.parametrize("item", param_or_missing(_whole_zh_inputs(), lambda it: f"{it[0]}-{it[1]}", CASES))
def test_zh_chunk_matches_reference(item):
    _, _, chunk = require_case(item, CASES)
    # get_phones_and_bert: collapse runs of spaces; fewer than 6 phones -> once more with "." in front
    text = re.sub(" {2,}", " ", chunk["input"])
    norm, phones, _ = clean_zh(text)
    if len(phones) < 6:
        norm, phones, _ = clean_zh("." + text)
    assert norm == chunk["norm_text"]
    assert phones == chunk["phones"]


# ---------------------------------------------------------------------------- documented behaviours


@pytest.mark.parametrize(
    ("text", "phones"),
    [
        ("不是", "b u2 sh ir4"),
        ("去不去", "q v4 b u5 q v4"),
        ("一样", "y i2 y ang4"),
        ("一天", "y i4 t ian1"),
        ("第一", "d i4 y i1"),
        ("一二三", "y i1 EE er4 s an1"),
        ("说一说", "sh uo1 y i5 sh uo1"),
        ("我很好", "w o3 h en2 h ao3"),
        ("展览馆", "zh an2 l an2 g uan3"),
        ("看看", "k an4 k an5"),
        ("朋友", "p eng2 y ou5"),
        ("箱子", "x iang1 z i05"),
        ("安", "AA an1"),
        ("哦", "OO o5"),
        ("雨", "y v3"),
        ("学", "x ve2"),
        ("四", "s i04"),
        ("是", "sh ir4"),
        ("也", "y E3"),
        ("言", "y En2"),
    ],
)
def test_pinyin_and_tone_sandhi(text, phones):
    got, word2ph = g2p(text, data=DATA)
    assert " ".join(got) == phones
    assert word2ph == [2] * len(text)


def test_erhua_copies_the_previous_tone_except_listed_words():
    phones, _ = g2p("小孩儿", data=DATA)
    assert phones[-4:] == ["h", "ai2", "EE", "er2"]
    phones, _ = g2p("一会儿", data=DATA)
    assert phones[-4:] == ["h", "ui4", "EE", "er4"]
    phones, _ = g2p("女儿", data=DATA)
    assert phones == ["n", "v3", "EE", "er2"]


@pytest.mark.parametrize(
    ("text", "norm"),
    [
        ("你好，世界！", "你好,世界!"),
        ("真的吗？！", "真的吗?"),
        ("嗯。。。", "恩."),
        ("《原神》是（一款）游戏", "原神是一款游戏"),
        ("好~", "好…"),
        ("等等...", "等等…"),
        ("abc你好😀", "你好"),
        ("第2名", "第两名"),
        ("9:30", "九点半"),
        ("呣", "母"),
    ],
)
def test_text_normalize(text, norm):
    assert text_normalize(text) == norm


def test_word2ph_counts_punctuation_once():
    phones, word2ph = g2p("你好,世界.", data=DATA)
    assert word2ph == [2, 2, 1, 2, 2, 1]
    assert phones[4] == "," and phones[-1] == "."


@pytest.mark.parametrize("bad", ["你好1", "hello", "你好ㄅ"])
def test_g2p_rejects_text_that_is_not_normalised(bad):
    with pytest.raises(TextFrontendError):
        g2p(bad, data=DATA)


def test_empty_text():
    assert text_normalize("") == ""
    assert g2p("", data=DATA) == ([], [])


def test_runtime_is_built_once_per_g2pw_choice():
    from dora_primespeech_mlx.text.g2pw import G2PWOptions

    off, on_without_model = G2PWOptions(), G2PWOptions(enabled=True)  # (the second falls back to pypinyin)
    assert chinese.runtime(off) is chinese.runtime(off)
    assert chinese.runtime(on_without_model) is not chinese.runtime(off)
    text = "你好,世界."
    assert g2p(text, data=replace(DATA, g2pw=on_without_model)) == g2p(text, data=replace(DATA, g2pw=off))


def test_concurrent_use_gives_the_same_phones():
    from concurrent.futures import ThreadPoolExecutor

    texts = [row["text"] for row in _ROWS if row["language"] == "all_zh" and not re.search("[A-Za-z￥^]", row["text"])]
    texts = [t for t in texts if t.strip()][:20] or ["你好，世界。", "一会儿见。"]
    expected = [clean_zh(t) for t in texts]
    with ThreadPoolExecutor(max_workers=4) as pool:
        assert list(pool.map(clean_zh, texts)) == expected


# ---------------------------------------------------------------------------- optional g2pW (no model here)


def test_g2pw_is_off_by_default(monkeypatch, caplog):
    from dora_primespeech_mlx.text import g2pw

    with caplog.at_level("INFO", logger=g2pw.__name__):
        assert g2pw.load_predictor(g2pw.G2PWOptions()) is None
    assert "not in use" in caplog.text
    assert not TextData.from_settings(Settings.from_env({})).g2pw.enabled  # PRIMESPEECH_G2PW unset: off


def test_g2pw_without_model_falls_back(monkeypatch, tmp_path, caplog):
    from dora_primespeech_mlx.text import g2pw

    folder = g2pw.g2pw_dir(tmp_path)
    assert g2pw.load_predictor(g2pw.G2PWOptions(enabled=True)) is None  # no folder given
    assert "no g2pW model folder" in caplog.text
    assert g2pw.load_predictor(g2pw.G2PWOptions(enabled=True, folder=str(folder))) is None
    assert "g2pW.onnx" in caplog.text
    env = {"PRIMESPEECH_G2PW": "1", "PRIMESPEECH_G2PW_VOCAB": str(tmp_path / "vocab.txt"),
           "PRIMESPEECH_MODEL_DIR": str(tmp_path)}
    options = TextData.from_settings(Settings.from_env(env)).g2pw  # the folder: <model_dir>/G2PWModel
    assert options == g2pw.G2PWOptions(True, str(tmp_path / "vocab.txt"), str(folder))
    assert g2pw.load_predictor(options) is None  # switched on, but no model here


def test_g2pw_helpers(tmp_path):
    from dora_primespeech_mlx.text import g2pw

    assert g2pw.split_pinyin(["hang2", "le5", ","]) == (["h", "l", ","], ["ang2", "e5", ","])
    (tmp_path / "a.rep").write_text("银行: ['yin2', 'hang2']\n长: ['chang2']\n", encoding="utf-8")
    (tmp_path / "b.rep").write_text("长: ['zhang3']\n", encoding="utf-8")
    fixes = g2pw.read_word_fixes(tmp_path / "a.rep", tmp_path / "b.rep", tmp_path / "absent.rep")
    assert fixes == {"银行": ["yin2", "hang2"], "长": ["zhang3"]}


def test_non_ascii_digits_are_read_as_numbers():
    # Upstream crashes (KeyError) on these; we read them like ASCII digits.
    assert text_normalize("我有٣个苹果") == text_normalize("我有3个苹果")


# ---- jieba's part-of-speech table, prepared ---------------------------------------------------------

_POSSEG_PROBE = """
import json, logging, sys
from pathlib import Path
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
from dora_primespeech_mlx.text import chinese
posseg = chinese._posseg(Path(sys.argv[1]))
import jieba_fast
fresh = posseg.POSTokenizer.__new__(posseg.POSTokenizer)
fresh.load_word_tag(jieba_fast.dt.get_dict_file())  # jieba's own parse, the oracle
table = posseg.dt.word_tag_tab
print(json.dumps({"n": len(table), "same": table == fresh.word_tag_tab, "de": table.get("的"),
                  "cut": [list(p) for p in posseg.lcut("我们一起去公园散步吧")]}))
"""


def _posseg_in_a_fresh_process(cache) -> tuple[dict, str]:
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _POSSEG_PROBE, str(cache)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_jieba_word_tags_are_prepared_once_and_read_back(tmp_path):
    """The first start parses jieba's part-of-speech table (as jieba does) and writes it; the next reads that copy
    (a copy edited on disk shows through: it is not parsed again); a damaged copy is parsed again (DEBUG)."""
    import marshal

    first, _ = _posseg_in_a_fresh_process(tmp_path)
    (path,) = tmp_path.glob("jieba-word-tags-*.marshal")
    assert first["same"] and first["n"] > 100_000
    again, _ = _posseg_in_a_fresh_process(tmp_path)
    assert again == first, "read back: the same table and the same segmentation"
    table = marshal.loads(path.read_bytes())
    table["的"] = "edited"
    path.write_bytes(marshal.dumps(table))
    edited, _ = _posseg_in_a_fresh_process(tmp_path)
    assert edited["de"] == "edited" and not edited["same"], "the prepared copy is what the next start reads"
    path.write_bytes(b"damaged")
    repaired, log = _posseg_in_a_fresh_process(tmp_path)
    assert repaired == first and "ignored" in log
    assert _posseg_in_a_fresh_process(tmp_path)[0] == first, "rewritten whole after the damage"
