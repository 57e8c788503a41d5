"""Sentence splitting and the ordered list of rewrite rules (a PaddleSpeech-style normaliser).

``TextNormalizer().normalize(text)`` returns the sentences of ``text`` with numbers, dates, times,
units and symbols written out in Chinese characters. The rules run in a fixed order; each later
rule only sees what the earlier ones left, so the order is part of the behaviour.
"""

from __future__ import annotations

import re
import string

from . import chronology as chrono
from . import numbers as num
from . import phonecode as phone
from . import quantifier as quant
from .traditional import to_simplified

# Full-width ASCII letters and digits -> ASCII. (The reference also lists U+3000 -> space, but
# with a key str.translate ignores, so the ideographic space is kept; it is removed later.)
_FULL_TO_HALF = {ord(c) + 0xFEE0: ord(c) for c in string.ascii_letters + string.digits}

_SENTENCE_END = re.compile(r"([：、，；。？！,;?!][”’]?)")
_DROPPED_ON_SPLIT = re.compile(r"[——《》【】<>{}()（）#&@“”^_|\\]")
_DROPPED_AFTER = re.compile(r"[-——《》【】<=>{}()（）#&@“”^_|\\]")

# Single characters spelled out after all number rules.
_SPELLED = str.maketrans(
    {
        "/": "每",
        **dict(zip("①②③④⑤⑥⑦⑧⑨⑩", "一二三四五六七八九十")),
        "α": "阿尔法",
        "β": "贝塔",
        "γ": "伽玛",
        "Γ": "伽玛",
        "δ": "德尔塔",
        "Δ": "德尔塔",
        "ε": "艾普西龙",
        "ζ": "捷塔",
        "η": "依塔",
        "θ": "西塔",
        "Θ": "西塔",
        "ι": "艾欧塔",
        "κ": "喀帕",
        "λ": "拉姆达",
        "Λ": "拉姆达",
        "μ": "缪",
        "ν": "拗",
        "ξ": "克西",
        "Ξ": "克西",
        "ο": "欧米克伦",
        "π": "派",
        "Π": "派",
        "ρ": "肉",
        "ς": "西格玛",
        "Σ": "西格玛",
        "σ": "西格玛",
        "τ": "套",
        "υ": "宇普西龙",
        "φ": "服艾",
        "Φ": "服艾",
        "χ": "器",
        "ψ": "普赛",
        "Ψ": "普赛",
        "ω": "欧米伽",
        "Ω": "欧米伽",
        # left-over arithmetic signs
        "+": "加",
        "-": "减",
        "×": "乘",
        "÷": "除",
        "=": "等",
    }
)

# (pattern, replacement) in the order they run after dates/times/units.
_NUMBER_RULES = (
    (num.RE_POWER, num.replace_power),
    (num.RE_FRAC, num.replace_frac),
    (num.RE_PERCENTAGE, num.replace_percentage),
    (phone.RE_MOBILE_PHONE, phone.replace_mobile),
    (phone.RE_TELEPHONE, phone.replace_phone),
    (phone.RE_NATIONAL_UNIFORM_NUMBER, phone.replace_phone),
    (num.RE_RANGE, num.replace_range),
    (num.RE_INTEGER, num.replace_negative_num),
    (num.RE_VERSION_NUM, num.replace_version_num),
    (num.RE_DECIMAL_NUM, num.replace_number),
    (num.RE_POSITIVE_QUANTIFIERS, num.replace_positive_quantifier),
    (num.RE_DEFAULT_NUM, num.replace_default_num),
    (num.RE_NUMBER, num.replace_number),
)


class TextNormalizer:
    """Chinese text normalisation (spaces and brackets dropped, numbers read out)."""

    def split(self, text: str) -> list[str]:
        """Cut after sentence punctuation; spaces and bracket-like symbols are removed first."""
        text = text.replace(" ", "")
        text = _DROPPED_ON_SPLIT.sub("", text)
        text = _SENTENCE_END.sub(r"\1\n", text).strip()
        return [sentence.strip() for sentence in re.split(r"\n+", text)]

    def normalize_sentence(self, sentence: str) -> str:
        sentence = to_simplified(sentence).translate(_FULL_TO_HALF)

        sentence = chrono.RE_DATE.sub(chrono.replace_date, sentence)
        sentence = chrono.RE_DATE2.sub(chrono.replace_date2, sentence)
        sentence = chrono.RE_TIME_RANGE.sub(chrono.replace_time, sentence)  # ranges first
        sentence = chrono.RE_TIME.sub(chrono.replace_time, sentence)

        sentence = num.RE_TO_RANGE.sub(num.replace_to_range, sentence)
        sentence = quant.RE_TEMPERATURE.sub(quant.replace_temperature, sentence)
        sentence = quant.replace_measure(sentence)

        while num.RE_ASMD.search(sentence):  # 1+2+3: each pass rewrites one operator per pair
            sentence = num.RE_ASMD.sub(num.replace_asmd, sentence)

        for pattern, replace in _NUMBER_RULES:
            sentence = pattern.sub(replace, sentence)

        sentence = sentence.translate(_SPELLED)
        return _DROPPED_AFTER.sub("", sentence)

    def normalize(self, text: str) -> list[str]:
        return [self.normalize_sentence(s) for s in self.split(text)]


_DEFAULT = TextNormalizer()


def normalize(text: str) -> list[str]:
    """Sentences of ``text``, normalised (see :class:`TextNormalizer`)."""
    return _DEFAULT.normalize(text)
