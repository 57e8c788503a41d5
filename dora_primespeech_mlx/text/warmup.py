"""Warming the front ends a voice will use, so the first real sentence of each language costs what later ones
cost (loading jieba and pypinyin, the CMU dictionaries, NLTK's tagger, g2p_en's network for unknown words,
wordsegment, inflect; pyopenjtalk, g2pk2 or ToJyutping for ja/ko/yue)."""

from __future__ import annotations

import time

from .errors import MissingExtraError
from .frontend import preprocess
from .options import TextData

# One sentence per language that reaches every lazily loaded part of its front end (numbers, an unknown
# word for the neural G2P, a compound for wordsegment, mixed scripts).
SAMPLES = {
    "zh": "你好，今天是2024年3月5日，温度是25.5度，我们一起去公园散步吧。",
    "en": "Hello world, 42 quick foxes read the Zorblaxian well-known notebook at 3:30 pm.",
    "ja": "こんにちは、今日は2024年3月5日です。東京へ行きましょう。",
    "ko": "안녕하세요, 오늘은 2024년 3월 5일입니다. 같이 공원에 가요.",
    "yue": "你好，今日係2024年3月5號，我哋一齊去公園散步啦。",
}


def languages_for(option: str) -> list[str]:
    """The front ends text in language option ``option`` may need (mixed text reaches English too)."""
    base = option.removeprefix("all_").removesuffix("_yue") if option != "auto_yue" else "yue"
    if base == "auto":
        return ["zh", "en"] + (["yue"] if option == "auto_yue" else [])
    return [base] + (["en"] if base != "en" else [])


def warm_up(option: str, version: str = "v2", *, data: TextData) -> dict[str, float]:
    """Run each front end ``option`` needs once; seconds per language (languages whose optional extra is
    missing are skipped: their first use reports the missing extra as usual)."""
    out = {}
    for lang in languages_for(option):
        t0 = time.perf_counter()
        try:
            preprocess(SAMPLES[lang], lang, "cut5", version, data=data)
        except MissingExtraError:
            continue
        out[lang] = time.perf_counter() - t0
    return out
