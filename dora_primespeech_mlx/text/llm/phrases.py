"""What every part of the LLM text stage shares: the language family of a text (the readings and marks it gets),
phrases ended with marks every front end reads as a pause, and the "holes" where something unspeakable (emoji,
markup) was removed, tidied with the spaces and pause marks around them."""

from __future__ import annotations

import re

SENTENCE_ENDS = "。！？.!?…"
PAUSE_MARKS = ",，、;；:："
ENDED = set(SENTENCE_ENDS + PAUSE_MARKS + "~～")
CJK_END = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f]")
_HANGUL = re.compile(r"[\u1100-\u11ff\u3130-\u318f\uac00-\ud7af]")
_KANA = re.compile(r"[\u3040-\u30ff\uff66-\uff9f]")
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")

# emoji: pictographs and their modifiers (not ©®™°℃ or arrows, which the front ends read or drop themselves)
_EMOJI_CHARS = (
    "\U0001F000-\U0001FAFF"  # mahjong .. symbols and pictographs extended-A (incl. flags' regional indicators)
    "\u2600-\u27BF"  # miscellaneous symbols, dingbats
    "\u2B00-\u2BFF"  # miscellaneous symbols and arrows (⭐ ⬆)
    "\u231A\u231B\u23E9-\u23FA\u24C2\u25AA\u25AB\u25B6\u25C0\u25FB-\u25FE\u3030\u303D\u3297\u3299"
    "\uFE0E\uFE0F\u200D\u20E3"  # variation selectors, zero-width joiner, keycap
    "\U000E0020-\U000E007F"  # tag characters (subdivision flags)
)
_EMOJI_RUN_RE = re.compile(rf"(?<![ \t])[ \t]*(?:[{_EMOJI_CHARS}][ \t]*)+")
# an emoji run opening a line with a pause mark after it ("👍，好的": the front end would speak a stray pause), or a
# line of emoji only (a message the node then skips)
LEADING_EMOJI_RE = re.compile(rf"^[ \t]*(?:[{_EMOJI_CHARS}][ \t]*)+(?:[{PAUSE_MARKS}]+[ \t]*|$)")
HOLE = "\uE000"  # stands where something unspeakable was removed, until the pauses around it are tidied
# a run of holes from its first hole on (the spaces before it are taken by a scan), its spaces and pause marks
_HOLES_RE = re.compile(rf"{HOLE}(?:[ \t]*{HOLE})*([ \t]*)([{PAUSE_MARKS}]*)[ \t]*")


def language_family(lang_hint: str | None, text: str = "") -> str:
    """"zh", "yue", "ja", "ko" or "en": from a language option (``all_zh``, ``auto_yue``, ...) or, for
    None/auto, from the scripts in ``text`` (Hangul, then kana, then Han; else English)."""
    hint = (lang_hint or "auto").lower().removeprefix("all_")
    if hint in ("zh", "yue", "ja", "ko", "en"):
        return hint
    if _HANGUL.search(text):
        return "ko"
    if _KANA.search(text):
        return "ja"
    if _HAN.search(text):
        return "yue" if hint == "auto_yue" else "zh"
    return "en"


def _end_mark(phrase: str, family: str) -> str:
    """The sentence mark a phrase gets: "。" when it holds Chinese or Japanese, "." otherwise (a phrase without
    letters: its language family's)."""
    if any(ch.isalpha() for ch in phrase):
        return "。" if CJK_END.search(phrase) else "."
    return "。" if family in ("zh", "yue", "ja") else "."


def as_phrase(phrase: str, family: str) -> str:
    """``phrase`` ended with a mark every front end reads as a pause: a sentence mark when it has none (and has
    something to speak); a closing colon or semicolon becomes a comma (the English front end drops ":" and ";",
    which glued "You will need:" to the next line's first word)."""
    stripped = phrase.rstrip()
    if not stripped or not any(ch.isalnum() for ch in stripped):
        return stripped
    if stripped[-1] in ":;：；":
        return stripped[:-1] + pause_mark(stripped[:-1], family)
    if stripped[-1] in ENDED:
        return stripped
    return stripped + _end_mark(stripped, family)


def pause_mark(text: str, family: str) -> str:
    """The pause mark after ``text``: by its last letter, "、" in Japanese, "，" in Chinese, "," otherwise."""
    for ch in reversed(text):
        if ch.isalpha():
            if not CJK_END.match(ch):
                return ","
            return "、" if family == "ja" or _KANA.search(text) else "，"
    return ","


def drop_holes(text: str) -> str:
    """Remove emoji and the marks of removed things with the spaces and pause marks they leave behind."""
    if HOLE not in text and not _EMOJI_RUN_RE.search(text):
        return text
    text = _EMOJI_RUN_RE.sub(lambda m: m.group(0).replace(m.group(0).strip(" \t"), HOLE), text)
    out: list[str] = []
    pos, blank = 0, True  # blank: the line up to ``pos`` is only whitespace
    while (hole := text.find(HOLE, pos)) >= 0:
        start = hole
        while start > pos and text[start - 1] in " \t":
            start -= 1
        m = _HOLES_RE.match(text, hole)
        blank = _blank_after(blank, text[pos:start])
        out.append(text[pos:start])
        out.append(_tidy_hole(blank, start < hole or bool(m.group(1)), m.group(2), text[start - 1: start],
                              text[m.end(): m.end() + 1]))
        blank = _blank_after(blank, text[start: m.end()])
        pos = m.end()
    out.append(text[pos:])
    return "".join(out)


def _blank_after(blank: bool, seg: str) -> bool:
    """Whether the current line is still only whitespace after ``seg`` (``blank``: it was before)."""
    nl = seg.rfind("\n")
    if nl >= 0:
        return not seg[nl + 1:].strip()
    return blank and not seg.strip()


def _tidy_hole(line_start: bool, spaced: bool, marks: str, before: str, after: str) -> str:
    """What replaces a run of holes with its spaces and pause marks: ``before``/``after`` are the characters
    next to it ("" at the text's ends)."""
    if line_start:
        return ""  # at a line start: the hole, its spaces and the pause mark after it go
    if marks:
        return marks  # "好的 👍，" -> "好的，"
    if not after or after in "\n" + SENTENCE_ENDS + ")）]】」』》":
        return ""
    if CJK_END.match(before) or CJK_END.match(after):
        return ""
    return " " if spaced or (before.isalnum() and after.isalnum()) else ""
