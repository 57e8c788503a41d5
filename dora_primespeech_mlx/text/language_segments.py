"""Splitting a text into language segments (docs/model.md, "Language segments").

Upstream ``get_phones_and_bert`` calls ``LangSegmenter.getTexts`` (``text/LangSegmenter``), which wraps
``split_lang.LangSplitter`` (split-lang 2.1.1, ``merge_across_digit=False``) and then applies its own
rules: ASCII-only pieces become English (``full_en``), digits are attached to a neighbour, unknown
("x") pieces are reduced to their CJK characters (``full_cjk``) or take a neighbour's language. The
first stage is :mod:`.script_split` (language by script rule instead of split-lang's fastText model; for
Chinese/English text the two agree, text fixtures README); this module holds the second and the options.

The language options are upstream's: ``all_zh``, ``zh``, ``en``, ``all_ja``, ``ja``, ``all_ko``, ``ko``,
``all_yue``, ``yue``, ``auto`` and ``auto_yue``; anything else raises :class:`UnsupportedLanguageError`.
"""

from __future__ import annotations

import re

from .errors import UnsupportedLanguageError
from .script_split import Piece, split_by_script

SUPPORTED_OPTIONS = ("all_zh", "zh", "en", "auto", "all_ja", "ja", "all_ko", "ko", "all_yue", "yue", "auto_yue")


#: Segment languages that have a front end (``clean_text``).
LANGUAGES = ("zh", "en", "ja", "ko", "yue")


#: all_* option -> (default language given to LangSegmenter.getTexts, label its "zh" pieces get)
_ALL_OPTIONS = {"all_zh": ("zh", "zh"), "all_ja": ("ja", "ja"), "all_ko": ("ko", "ko"), "all_yue": ("zh", "yue")}


def unsupported(language: str) -> UnsupportedLanguageError:
    return UnsupportedLanguageError(
        f"language {language!r} is not supported (supported options: {', '.join(SUPPORTED_OPTIONS)})"
    )


def check_option(option: str) -> str:
    """Validate a language option; raise :class:`UnsupportedLanguageError` for anything else."""
    if option not in SUPPORTED_OPTIONS:
        raise unsupported(option)
    return option


# LangSegmenter.full_en (note: "." does not cross a newline, so the first line needs a letter).
_FULL_EN_RE = re.compile(r"^(?=.*[A-Za-z])[A-Za-z0-9\s\u0020-\u007E\u2000-\u206F\u3000-\u303F\uFF00-\uFFEF]+$")


_CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DB5),
    (0x20000, 0x2A6DD),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0x2CEB0, 0x2EBEF),
    (0x30000, 0x3134A),
    (0x31350, 0x323AF),
    (0x2EBF0, 0x2EE5D),
)


_CJK_KEEP = frozenset("0123456789。！？.!?… /") | frozenset(chr(c) for c in range(0x3001, 0x301D))


_JAKO_SEP = "0-9\u3001-\u301c。！？.!?… "


_KANA_RUN = "\u3041-\u3096\u3099\u309a\u30a1-\u30fa\u30fc"


_HANGUL_RUN = "\u1100-\u11ff\u3130-\u318f\uac00-\ud7af"


_JA_RUN_RE = re.compile(f"[{_KANA_RUN}]+(?:[{_JAKO_SEP}]+[{_KANA_RUN}]*)*")


_KO_RUN_RE = re.compile(f"[{_HANGUL_RUN}]+(?:[{_JAKO_SEP}]+[{_HANGUL_RUN}]*)*")


_DIGIT_NEIGHBOUR_PUNCT = frozenset(",.!?，。！？")


def full_en(text: str) -> bool:
    return _FULL_EN_RE.match(text) is not None


def full_cjk(text: str) -> str:
    """The CJK ideographs (and a few digits/marks) of ``text``; everything else is dropped."""
    kept = []
    for ch in text:
        cp = ord(ch)
        if ch in _CJK_KEEP or any(lo <= cp <= hi for lo, hi in _CJK_RANGES):
            kept.append(ch)
    return "".join(kept)


def _merge_lang(pieces: list[Piece], item: Piece) -> None:
    if pieces and pieces[-1].lang == item.lang:
        pieces[-1].add(item.text)
    else:
        pieces.append(item)


def _split_jako(tag: str, item: Piece) -> list[Piece]:
    pattern = _JA_RUN_RE if tag == "ja" else _KO_RUN_RE
    out: list[Piece] = []
    pos = 0
    for m in pattern.finditer(item.text):
        if m.start() > pos:
            out.append(Piece(item.lang, item.text[pos : m.start()]))
        pos = m.end()
        out.append(Piece(tag, m.group()))
    if pos < item.size:
        out.append(Piece(item.lang, item.text[pos:]))
    return out


def _unknown_to_cjk(item: Piece) -> Piece:
    cjk = full_cjk(item.text)
    return Piece("zh", cjk) if cjk else item


def _resolve_digit(item: Piece, i: int, items: list[Piece], done: list[Piece]) -> str:
    last = i == len(items) - 1
    if done and last:
        return done[-1].lang
    if not done and not last:
        return items[1].lang
    if done and not last:
        prev, nxt = done[-1], items[i + 1]
        if prev.lang == nxt.lang:
            return prev.lang
        if prev.last_char() in _DIGIT_NEIGHBOUR_PUNCT:
            return nxt.lang
        if nxt.first_char() in _DIGIT_NEIGHBOUR_PUNCT:
            return prev.lang
        if item.last_char() in "。.":
            return prev.lang
        return prev.lang if prev.size >= nxt.size else nxt.lang
    return "zh"


def get_texts(text: str, default_lang: str = "") -> list[Piece]:
    """Upstream ``LangSegmenter.getTexts``: language pieces of ``text``.

    With ``default_lang`` (the ``all_*`` options) every piece that is not pure ASCII-ish English
    (``full_en``) gets ``default_lang``; without it, the detected languages stay.
    """
    result: list[Piece] = []
    have_digits = False
    for sub in split_by_script(text):
        item = Piece(sub.lang, sub.text)
        if item.lang == "digit":
            if default_lang:
                item.lang = default_lang
            else:
                have_digits = True
            _merge_lang(result, item)
            continue
        if full_en(item.text):
            item.lang = "en"
            _merge_lang(result, item)
            continue
        if default_lang:
            item.lang = default_lang
            _merge_lang(result, item)
            continue
        ja_list = _split_jako("ja", item) if item.lang != "ja" else []
        if not ja_list:
            ja_list = [item]
        ko_list: list[Piece] = []
        parts: list[Piece] = []
        for ko_item in ja_list:
            if ko_item.lang != "ko":
                ko_list = _split_jako("ko", ko_item)
            parts.extend(ko_list if ko_list else [ko_item])
        if len(parts) == 1:
            _merge_lang(result, _unknown_to_cjk(item) if item.lang == "x" else item)
            continue
        for part in parts:
            _merge_lang(result, _unknown_to_cjk(part) if part.lang == "x" else part)

    if have_digits:
        items, result = result, []
        for i, item in enumerate(items):
            if item.lang == "digit":
                item.lang = _resolve_digit(item, i, items, result)
            _merge_lang(result, item)

    items, result = result, []
    for item in items:
        if item.lang == "x":
            if result:
                item.lang = result[-1].lang
            elif len(items) > 1:
                item.lang = items[1].lang
            else:
                item.lang = "zh"
        _merge_lang(result, item)
    return result


def split_languages(text: str, option: str) -> list[tuple[str, str]]:
    """(language, text) segments for a language option, as ``get_phones_and_bert`` builds them.

    - ``en``: the whole text is English (never split).
    - ``all_zh`` / ``all_ja`` / ``all_ko``: everything in that language except pure-Latin pieces
      (English); digits join that language. ``all_yue``: as ``all_zh``, Chinese pieces labelled ``yue``.
    - ``zh`` / ``ja`` / ``ko`` / ``yue``: neighbouring non-English pieces merge into one segment of that
      language (Han text included: upstream cannot tell Chinese, Japanese and Korean Han apart).
    - ``auto``: the detected languages (zh, ja, ko, en; here by script, see the module doc);
      ``auto_yue``: the same with Chinese pieces labelled ``yue``.

    Text that is empty or whitespace-only raises TextFrontendError, except with ``en``.
    """
    check_option(option)
    if option == "en":
        return [("en", text)]
    if option in _ALL_OPTIONS:
        default, zh_label = _ALL_OPTIONS[option]
        return [(zh_label if p.lang == "zh" else p.lang, p.text) for p in get_texts(text, default)]
    pieces = get_texts(text)
    if option in ("auto", "auto_yue"):
        label = "yue" if option == "auto_yue" else "zh"
        return [(label if p.lang == "zh" else p.lang, p.text) for p in pieces]
    merged: list[Piece] = []
    for p in pieces:  # options "zh", "ja", "ko", "yue"
        _merge_lang(merged, Piece("en" if p.lang == "en" else option, p.text))
    return [(p.lang, p.text) for p in merged]
