"""Cutting a target text into chunks before phonemisation (docs/model.md, "Cutting the target text").

Reproduces upstream ``TTS_infer_pack/text_segmentation_method.py`` (the cut methods ``cut0``…``cut5``
and ``split_big_text``) and the text side of ``TextPreprocessor.preprocess``
(``replace_consecutive_punctuation`` and ``pre_seg_text``), character for character.

:func:`split_text` is the public entry: the chunk list that ``preprocess`` sends to the phoneme step.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from .errors import TextFrontendError

#: Characters after which the shared ``split()`` cuts; also "already ends with punctuation".
splits = frozenset("，。？！,.?!~:：—…")

#: What the cut methods treat as "pure punctuation" (an item made only of these is dropped).
_CUT_PUNCTUATION = frozenset("!?…,.- ")
#: Where ``cut5`` cuts (a "." between two digits is a decimal point and does not cut).
_CUT5_MARKS = frozenset(",.;?!、，。？！;：…")
#: Runs of these collapse to their first character before cutting (``replace_consecutive_punctuation``).
_REPEATABLE = "!?…,.-"

_SPLITS_CLASS = "[" + "".join(re.escape(c) for c in sorted(splits)) + "]"
_SPLITS_RE = re.compile(_SPLITS_CLASS)
_SPLITS_KEEP_RE = re.compile("(" + _SPLITS_CLASS + ")")
_REPEAT_RE = re.compile("([{0}])([{0}])+".format("".join(re.escape(c) for c in _REPEATABLE)))
_CUT4_RE = re.compile(r"(?<!\d)\.(?!\d)")
_NON_WORD_RE = re.compile(r"\W+")
_BLANK_LINES_RE = re.compile(r"\n{2,}")

MAX_CHUNK_CHARS = 510
MIN_CHUNK_CHARS = 5


def _drop_punctuation_items(items: list[str]) -> list[str]:
    return [item for item in items if not set(item) <= _CUT_PUNCTUATION]


def _split_clauses(text: str) -> list[str]:
    """Upstream ``split()``: clauses, each ending with a character of :data:`splits`."""
    if not text:
        raise TextFrontendError("cannot cut an empty text into clauses")
    text = text.replace("……", "。").replace("——", "，")
    if text[-1] not in splits:
        text += "。"
    clauses = []
    start = 0
    for i, ch in enumerate(text):
        if ch in splits:
            clauses.append(text[start : i + 1])
            start = i + 1
    return clauses


def cut0(text: str) -> str:
    """No cut ("\\n" when the text is only punctuation/spaces)."""
    return "\n" if set(text) <= _CUT_PUNCTUATION else text


def cut1(text: str) -> str:
    """Groups of four clauses (the last group takes the remainder)."""
    text = text.strip("\n")
    clauses = _split_clauses(text)
    starts = list(range(0, len(clauses), 4))
    if len(starts) > 1:
        bounds = [*starts[:-1], None]
        items = ["".join(clauses[bounds[i] : bounds[i + 1]]) for i in range(len(bounds) - 1)]
    else:
        items = [text]
    return "\n".join(_drop_punctuation_items(items))


def cut2(text: str) -> str:
    """Clauses accumulated until a group has more than 50 characters; a short tail joins the last group."""
    text = text.strip("\n")
    clauses = _split_clauses(text)
    if len(clauses) < 2:
        return text
    items = []
    count = 0
    current: list[str] = []
    for clause in clauses:
        count += len(clause)
        current.append(clause)
        if count > 50:
            items.append("".join(current))
            count = 0
            current = []
    if current:
        items.append("".join(current))
    if len(items) > 1 and len(items[-1]) < 50:
        items[-2] += items[-1]
        items.pop()
    return "\n".join(_drop_punctuation_items(items))


def cut3(text: str) -> str:
    """Cut at every Chinese full stop "。" (which is removed)."""
    text = text.strip("\n")
    return "\n".join(_drop_punctuation_items(text.strip("。").split("。")))


def cut4(text: str) -> str:
    """Cut at every "." that is not between digits (the "." is removed)."""
    text = text.strip("\n")
    return "\n".join(_drop_punctuation_items(_CUT4_RE.split(text.strip("."))))


def cut5(text: str) -> str:
    """Cut after every punctuation mark, except a decimal point between two digits."""
    text = text.strip("\n")
    items = []
    start = 0
    last = len(text) - 1
    for i, ch in enumerate(text):
        if ch not in _CUT5_MARKS:
            continue
        if ch == "." and 0 < i < last and text[i - 1].isdigit() and text[i + 1].isdigit():
            continue
        items.append(text[start : i + 1])
        start = i + 1
    if start < len(text):
        items.append(text[start:])
    return "\n".join(item for item in items if not set(item) <= _CUT5_MARKS)


METHODS: dict[str, Callable[[str], str]] = {
    "cut0": cut0,
    "cut1": cut1,
    "cut2": cut2,
    "cut3": cut3,
    "cut4": cut4,
    "cut5": cut5,
}


def get_method(name: str) -> Callable[[str], str]:
    """A cut method by its upstream name ("cut0" … "cut5")."""
    try:
        return METHODS[name]
    except KeyError:
        raise TextFrontendError(
            f"unknown text split method {name!r}; expected one of {', '.join(METHODS)}"
        ) from None


def split_big_text(text: str, max_len: int = MAX_CHUNK_CHARS) -> list[str]:
    """Upstream ``split_big_text``: pack the pieces between split marks into chunks of <= ``max_len``.

    Like upstream, a first piece that is already longer than ``max_len`` yields an empty first chunk,
    and a piece longer than ``max_len`` is not cut further.
    """
    result = []
    current = ""
    for piece in _SPLITS_KEEP_RE.split(text):
        if len(current) + len(piece) > max_len:
            result.append(current)
            current = piece
        else:
            current += piece
    if current:
        result.append(current)
    return result


def replace_consecutive_punctuation(text: str) -> str:
    """Collapse a run of ``! ? … , . -`` to its first character."""
    return _REPEAT_RE.sub(r"\1", text)


def first_clause(text: str) -> str:
    """Upstream ``get_first``: the stripped text before the first split mark."""
    return _SPLITS_RE.split(text, maxsplit=1)[0].strip()


def merge_short_text_in_array(texts: list[str], threshold: int) -> list[str]:
    """Concatenate pieces until each has at least ``threshold`` characters; a short rest joins the last."""
    if len(texts) < 2:
        return texts
    result: list[str] = []
    current = ""
    for piece in texts:
        current += piece
        if len(current) >= threshold:
            result.append(current)
            current = ""
    if current:
        if result:
            result[-1] += current
        else:
            result.append(current)
    return result


def filter_text(texts: list[str]) -> list[str]:
    """Upstream ``filter_text``: refuse an all-blank list, drop "", " " pieces."""
    if all(t in (None, " ", "\n", "") for t in texts):
        raise TextFrontendError("Please enter valid text: the text has nothing to speak")
    return [t for t in texts if t not in (None, " ", "")]


def _end_mark(language: str) -> str:
    return "." if language == "en" else "。"


def pre_seg_text(text: str, language: str, method: str) -> list[str]:
    """Upstream ``TextPreprocessor.pre_seg_text``: the chunks to phonemise, in order.

    ``text`` should already have gone through :func:`replace_consecutive_punctuation` (as in
    ``preprocess``); :func:`split_text` does both.
    """
    cut = get_method(method)
    text = text.strip("\n")
    if not text:
        return []
    if text[0] not in splits and len(first_clause(text)) < 4:
        text = _end_mark(language) + text
    text = _BLANK_LINES_RE.sub("\n", cut(text))
    pieces = merge_short_text_in_array(filter_text(text.split("\n")), MIN_CHUNK_CHARS)
    chunks: list[str] = []
    for piece in pieces:
        if not piece.strip():
            continue
        if not _NON_WORD_RE.sub("", piece):  # only symbols: nothing to speak
            continue
        if piece[-1] not in splits:
            piece += _end_mark(language)
        if len(piece) > MAX_CHUNK_CHARS:
            chunks.extend(split_big_text(piece))
        else:
            chunks.append(piece)
    return chunks


def split_text(text: str, method: str = "cut5", language: str = "zh") -> list[str]:
    """The chunk list ``TextPreprocessor.preprocess`` phonemises: consecutive punctuation collapsed,
    then :func:`pre_seg_text`. ``language`` is the language option (only "en" changes anything:
    it adds "." instead of "。")."""
    if not isinstance(text, str):
        raise TextFrontendError(f"text must be a str, not {type(text).__name__}")
    return pre_seg_text(replace_consecutive_punctuation(text), language, method)
