"""Korean front end (upstream ``text/korean.py``, model version v2).

* :func:`text_normalize` returns the text unchanged.
* :func:`g2p`: Latin letters -> Hangul letter names (``a`` -> ``에이``), then g2pk2 (its ``idioms.txt``,
  number reading with part-of-speech tags from MeCab-ko, sound-change rules), decomposition into
  compatibility jamo with compound vowels split (``ㅘ`` -> ``ㅗ ㅏ``), upstream's ``fix_g2pk2_error``,
  a ``.`` after a final jamo, then one symbol per character: space -> ``空``, Chinese-style marks ->
  ``, . ! ?``, anything else outside the v2 table -> ``停``.

g2pk2, python-mecab-ko (+ mecab-ko-dic) and jamo come with the extra ``ko``. g2pk2 loads NLTK's ``cmudict`` and
would download it itself: it is looked for (and downloaded once if missing) through
:func:`~.data.ensure_nltk_data` first. A number read before a counter goes through a Python ``set``, so
``1개 ... 11개`` depends on the hash seed (``PYTHONHASHSEED``), in upstream as here."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import threading

from .data import ensure_nltk_data
from .errors import TextFrontendError
from .extras import import_extra, missing
from .options import TextData
from .symbols import symbols

_LATIN_NAMES = {
    "a": "에이", "b": "비", "c": "시", "d": "디", "e": "이", "f": "에프", "g": "지", "h": "에이치", "i": "아이",
    "j": "제이", "k": "케이", "l": "엘", "m": "엠", "n": "엔", "o": "오", "p": "피", "q": "큐", "r": "아르",
    "s": "에스", "t": "티", "u": "유", "v": "브이", "w": "더블유", "x": "엑스", "y": "와이", "z": "제트",
}  # fmt: skip
# One pattern per letter, case-insensitive as upstream (so e.g. the Kelvin sign matches "k" too).
_LATIN_RES = [(re.compile(letter, re.IGNORECASE), name) for letter, name in _LATIN_NAMES.items()]

_COMPOUND_VOWELS = {
    "ㅘ": "ㅗㅏ", "ㅙ": "ㅗㅐ", "ㅚ": "ㅗㅣ", "ㅝ": "ㅜㅓ", "ㅞ": "ㅜㅔ", "ㅟ": "ㅜㅣ", "ㅢ": "ㅡㅣ",
    "ㅑ": "ㅣㅏ", "ㅒ": "ㅣㅐ", "ㅕ": "ㅣㅓ", "ㅖ": "ㅣㅔ", "ㅛ": "ㅣㅗ", "ㅠ": "ㅣㅜ",
}  # fmt: skip
_COMPOUND_RE = re.compile("|".join(_COMPOUND_VOWELS))
_FINAL_JAMO_RE = re.compile(r"([\u3131-\u3163])$")
SPACE, PAUSE = "空", "停"
_MARK_MAP = {
    "：": ",", "；": ",", "，": ",", "。": ".", "！": "!", "？": "?", "\n": ".", "·": ",", "、": ",", " ": SPACE,
}  # fmt: skip

_lock = threading.Lock()
_runtime: tuple | None = None  # (g2pk2.G2p instance, jamo.h2j, jamo.j2hcj)


def _load(data: TextData):
    global _runtime
    with _lock:
        if _runtime is None:
            jamo = import_extra("ko", "jamo")
            if importlib.util.find_spec("mecab") is None:  # else g2pk2 runs "pip install python-mecab-ko"
                raise missing("ko", "cannot import mecab (python-mecab-ko)")
            # NLTK's cmudict: g2pk2 loads it (for English words, which never reach it here: Latin letters
            # are spelled out first) and would download it itself on import when missing.
            ensure_nltk_data(("cmudict",), "the Korean front end (g2pk2)", data=data)
            g2pk2 = import_extra("ko", "g2pk2")
            with contextlib.redirect_stdout(io.StringIO()):  # g2pk2 prints "mecab installed"
                g2p = g2pk2.G2p()
            if getattr(g2p, "mecab", None) is None:
                raise missing("ko", "g2pk2 could not open MeCab-ko (python-mecab-ko / mecab-ko-dic)")
            # g2pk2 applies its ~600 table rules with re.sub(str, ...): more patterns than the re module caches,
            # so every call would recompile them all (docs/languages.md#speed-and-first-load). Same rules, compiled
            # once.
            g2p.table = [(re.compile(pattern), repl, rule_ids) for pattern, repl, rule_ids in g2p.table]
            _runtime = (g2p, jamo.h2j, jamo.j2hcj)
        return _runtime


def text_normalize(text: str) -> str:
    return text


def latin_to_hangul(text: str) -> str:
    for regex, name in _LATIN_RES:
        text = regex.sub(name, text)
    return text


def fix_g2pk2_error(text: str) -> str:
    """Upstream's fix: ``ㅇㅡㄹ ㄹ`` / ``ㄹㅡㄹ ㄹ`` -> ``... ㄴ``."""
    out: list[str] = []
    i = 0
    while i < len(text) - 4:
        if text[i : i + 3] in ("ㅇㅡㄹ", "ㄹㅡㄹ") and text[i + 3] == " " and text[i + 4] == "ㄹ":
            out.append(text[i : i + 3] + " ㄴ")
            i += 5
        else:
            out.append(text[i])
            i += 1
    out.append(text[i:])
    return "".join(out)


def g2p(norm_text: str, *, data: TextData) -> list[str]:
    """Phones of Korean text (g2pk2, then jamo); ``data``: where NLTK data is downloaded when missing."""
    g2pk, h2j, j2hcj = _load(data)
    table = frozenset(symbols("v2"))
    text = g2pk(latin_to_hangul(norm_text))
    if not isinstance(text, str):
        raise TextFrontendError(f"g2pk2 returned {type(text).__name__} for {norm_text[:40]!r}")
    text = _COMPOUND_RE.sub(lambda m: _COMPOUND_VOWELS[m.group()], j2hcj(h2j(text)))
    text = _FINAL_JAMO_RE.sub(r"\1.", fix_g2pk2_error(text))
    phones = []
    for ch in text:
        ph = _MARK_MAP.get(ch, ch)
        phones.append(ph if ph in table else PAUSE)
    return phones
