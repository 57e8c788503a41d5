"""Chinese normalisation rules (documented behaviours of the reference front end) and the
generated pinyin -> phone map."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dora_primespeech_mlx.text.chinese import text_normalize
from dora_primespeech_mlx.text.pinyin_map import opencpop_lines, pinyin_to_phones
from dora_primespeech_mlx.text.zh_normalization import TextNormalizer, num2str, to_simplified


@pytest.mark.parametrize(
    ("text", "norm"),
    [
        # dates and times
        ("2024年3月15日", "二零二四年三月十五日"),
        ("2025-01-08", "二零二五年一月八日"),
        ("9:30", "九点半"),
        ("14:05:09", "十四点零五分零九秒"),
        ("8:00-22:00", "八点至二十二点"),
        ("8:30-9:15", "八点半至九点半"),  # upstream reads the range's second minute from the first
        ("3:2", "三二"),
        # numbers, measure words, phone numbers
        ("第2名", "第两名"),
        ("2个", "两个"),
        ("13812345678", "幺三八幺二三四五六七八"),
        ("1234567个", "幺二三四五六七个"),
        ("302", "三零二"),
        ("100-200元", "幺零零减二百元"),
        ("10050", "幺零零五零"),  # 3+ bare digits: digit by digit
        ("10050元", "一万零五十元"),
        ("12", "十二"),
        # signs, fractions, powers, decimals
        ("-5℃", "零下五度"),
        ("12.5%", "百分之十二点五"),
        ("3/4", "四分之三"),
        ("2³", "二的三次方"),
        ("1+1=2", "一加一等于二"),
        ("-0.5", "负零零点五"),
        (".25", "零点二五"),
        ("1.2.3", "一点二点三"),
        ("3.20", "三点二零"),
        ("5kg", "五千克"),
        ("1~5", "一到五"),
        # symbols, scripts, punctuation
        ("α", "阿尔法"),
        ("①", "一"),
        ("a/b", "每"),
        ("國語", "国语"),
        ("ＡＢＣ１２３", "幺二三"),
        ("你好：世界；再见、朋友·吗", "你好,世界,再见,朋友,吗"),
        ("什么？！", "什么?"),
        ("啊——但是《原神》", "啊但是原神"),
        ("嗯呣", "恩母"),
        ("我 们", "我们"),
    ],
)
def test_normalization(text, norm):
    assert text_normalize(text) == norm


def test_sentences_are_split_after_punctuation():
    assert TextNormalizer().normalize("你好，世界。再见！") == ["你好，", "世界。", "再见！"]


@pytest.mark.parametrize(
    ("digits", "read"),
    [("0", "零"), ("000", "零"), ("10", "十"), ("110", "一百一十"), ("100000005", "一亿零五"), ("3.0", "三点零")],
)
def test_num2str(digits, read):
    assert num2str(digits) == read


def test_traditional_to_simplified_keeps_unknown_characters():
    assert to_simplified("漢字abc😀") == "汉字abc😀"


def test_pinyin_map_rules():
    table = pinyin_to_phones()
    assert table["zhi"] == ("zh", "ir") and table["zi"] == ("z", "i0")
    assert table["ju"] == table["jv"] == ("j", "v")
    assert table["yan"] == ("y", "En") and table["a"] == ("AA", "a") and table["er"] == ("EE", "er")


def test_pinyin_map_equals_opencpop_strict():
    """The generated map is the original ``opencpop-strict.txt``, line for line."""
    folder = os.environ.get("PRIMESPEECH_TEXT_DATA", "")
    path = Path(folder) / "opencpop-strict.txt"
    if not folder or not path.is_file():
        pytest.skip("opencpop-strict.txt not found (set PRIMESPEECH_TEXT_DATA)")
    assert opencpop_lines() == path.read_text(encoding="utf-8").splitlines()
