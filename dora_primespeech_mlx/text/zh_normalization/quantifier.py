"""Temperatures and metric unit abbreviations."""

from __future__ import annotations

import re

from .numbers import num2str

# -3°C -> 零下三度
# a number starts where no digit precedes it (without the lookbehind every start rescans a digit run: quadratic)
RE_TEMPERATURE = re.compile(r"(-?)(?<!\d)(\d+(\.\d+)?)(°C|℃|度|摄氏度)")


def replace_temperature(m: re.Match) -> str:
    sign = "零下" if m.group(1) else ""
    unit = "摄氏度" if m.group(4) == "摄氏度" else "度"
    return f"{sign}{num2str(m.group(2))}{unit}"


# Plain substring replacement in this order, as the reference does: "m" is replaced before
# "mm" (so "mm" reads 米米) and any lone "s" becomes 秒, even inside Latin words.
_MEASURES = (
    ("cm2", "平方厘米"),
    ("cm²", "平方厘米"),
    ("cm3", "立方厘米"),
    ("cm³", "立方厘米"),
    ("cm", "厘米"),
    ("db", "分贝"),
    ("ds", "毫秒"),
    ("kg", "千克"),
    ("km", "千米"),
    ("m2", "平方米"),
    ("m²", "平方米"),
    ("m³", "立方米"),
    ("m3", "立方米"),
    ("ml", "毫升"),
    ("m", "米"),
    ("mm", "毫米"),
    ("s", "秒"),
)


def replace_measure(sentence: str) -> str:
    for abbreviation, word in _MEASURES:
        sentence = sentence.replace(abbreviation, word)
    return sentence
