"""split-lang 2.1.1's ``LangSplitter`` (``merge_across_digit=False``), the first stage of upstream's language
split (docs/model.md, "Language segments"): pre-split at punctuation and script changes, per-word language by script
(kana -> ja, hangul -> ko, Han -> zh, Latin -> en; split-lang asks fastText ``lid.176`` instead, which
agrees on Chinese/English text), then split-lang's merge rules. :func:`split_by_script` is the entry point;
:mod:`.language_segments` applies upstream's ``LangSegmenter`` rules on top."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import TextFrontendError

# split-lang's punctuation set (each mark is its own pre-split section).
_SL_PUNCTUATION = frozenset("!\"#$%&'()*+,-.:;<=>?@[\\]^_`{|}~·—‘’“”…、。〈〉《》「」『』【】〜！（），：；？￥")


# pre-split section kinds
_ZH_JA, _KO, _DIGIT, _PUNCT, _NEWLINE, _OTHERS = "zh_ja", "ko", "digit", "punct", "newline", "others"


_ZH_JA_RE = re.compile(r"[\u4e00-\u9fff\u3040-\u30ff々]")


_HANGUL_SYLLABLE_RE = re.compile(r"[\uac00-\ud7af]")


_KANA_RE = re.compile(r"[\u3040-\u30ff々]")


# Script rule used instead of fastText.
_SCRIPT_KANA_RE = re.compile(r"[\u3040-\u30ff々\u31f0-\u31ff\uff66-\uff9d]")


_SCRIPT_HANGUL_RE = re.compile(r"[\u1100-\u11ff\u3130-\u318f\ua960-\ua97f\uac00-\ud7af\ud7b0-\ud7ff]")


_SCRIPT_HAN_RE = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ebef\U00030000-\U000323af]")


_SCRIPT_LATIN_RE = re.compile(r"[A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u1e00-\u1eff]")


def script_language(text: str) -> str | None:
    """The script rule: "ja", "ko", "zh", "en", or None when no letter of those scripts occurs."""
    if _SCRIPT_KANA_RE.search(text):
        return "ja"
    if _SCRIPT_HANGUL_RE.search(text):
        return "ko"
    if _SCRIPT_HAN_RE.search(text):
        return "zh"
    if _SCRIPT_LATIN_RE.search(text):
        return "en"
    return None


class Piece:
    """A language-tagged substring, grown by :meth:`add` while merging (in amortised linear time).
    ``lang`` is a language code or one of "digit", "punctuation", "newline", "x" (unknown)."""

    __slots__ = ("_parts", "lang", "size")

    def __init__(self, lang: str, text: str):
        self.lang = lang
        self._parts = [text]
        self.size = len(text)

    @property
    def text(self) -> str:
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0]

    def add(self, text: str) -> None:
        self._parts.append(text)
        self.size += len(text)

    def first_char(self) -> str:
        return next(p for p in self._parts if p)[0]

    def last_char(self) -> str:
        return next(p for p in reversed(self._parts) if p)[-1]

    def __repr__(self) -> str:
        return f"Piece({self.lang!r}, {self.text!r})"


@dataclass
class _Section:
    kind: str
    pieces: list[Piece]


def _pre_split(text: str) -> list[tuple[str, str]]:
    """Cut ``text`` (already stripped) into runs of one character class."""
    sections: list[tuple[str, str]] = []
    kind = _OTHERS
    current: list[str] = []

    def flush():
        if current:
            sections.append((kind, "".join(current)))
            current.clear()

    for i, ch in enumerate(text):
        if _ZH_JA_RE.match(ch):
            if kind != _ZH_JA:
                flush()
                kind = _ZH_JA
        elif _HANGUL_SYLLABLE_RE.match(ch):
            if kind != _KO:
                flush()
                kind = _KO
        elif ch.isdigit():
            if kind != _DIGIT:
                flush()
                kind = _DIGIT
        elif ch in _SL_PUNCTUATION:
            if not (ch == "'" and i > 0 and not text[i - 1].isspace()):  # "'" inside a word stays
                flush()
                kind = _PUNCT
        elif ch.isspace():
            if ch in "\n\r":
                flush()
                kind = _NEWLINE
        elif kind != _OTHERS:
            flush()
            kind = _OTHERS
        current.append(ch)
    flush()
    return sections


def _zh_ja_words(text: str) -> list[str]:
    """Phrases of a CJK section, each a non-kana run and the kana run after it (split-lang uses budoux
    phrases such as 今日は / 天気ですね; only whether a phrase holds kana matters for the language
    decision). Spaces stay with the phrase before them."""
    words: list[str] = []
    prev_kana: bool | None = None
    for ch in text:
        is_kana = bool(_KANA_RE.match(ch))
        if ch.isspace() and words:
            words[-1] += ch
            continue
        if prev_kana is None or (prev_kana and not is_kana):
            words.append(ch)
        else:
            words[-1] += ch
        prev_kana = is_kana
    if len(words) >= 2 and len(words[0]) == 1:
        words[1] = words[0] + words[1]
        words = words[1:]
    return words


def _other_words(text: str) -> list[str]:
    """Whitespace-separated words, each keeping the spaces after it."""
    words: list[str] = []
    chars: list[str] = []
    seen_space = False
    for ch in text:
        if not ch.isspace():
            if seen_space:
                words.append("".join(chars))
                chars.clear()
                seen_space = False
        else:
            seen_space = True
        chars.append(ch)
    if chars:
        words.append("".join(chars))
    return words


def _zh_ja_lang(word: str) -> str:
    return "ja" if _KANA_RE.search(word) else "zh"


def _other_lang(word: str) -> str:
    return script_language(word) or "x"


def _possible_languages(text: str) -> set[str]:
    """Stand-in for split-lang's top-5 fastText candidates."""
    text = text.replace("\n", "").strip()
    return {lang for lang in ("ja", "ko", "zh", "en") if script_language(text) == lang}


def _has_kana(text: str) -> bool:
    return _KANA_RE.search(text) is not None


def _merge_same(pieces: list[Piece]) -> list[Piece]:
    out: list[Piece] = []
    for p in pieces:
        if out and out[-1].lang == p.lang:
            out[-1].add(p.text)
        else:
            out.append(p)
    return out


def _merge_middle(pieces: list[Piece]) -> list[Piece]:
    for i in range(len(pieces) - 2):
        left, middle, right = pieces[i], pieces[i + 1], pieces[i + 2]
        if left.lang != right.lang or left.lang in ("x", "newline"):
            continue
        no_kana = not _has_kana(middle.text)
        if (
            (left.lang in _possible_languages(middle.text) and no_kana)
            or middle.lang == "x"
            or (middle.size <= 4 and left.size + right.size >= 6 and no_kana)
        ):
            middle.lang = left.lang
    return pieces


def _nearest_lang(pieces: list[Piece], index: int, search_left: bool) -> str:
    others = range(index - 1, -1, -1) if search_left else range(index + 1, len(pieces))
    for j in others:
        if pieces[j].lang not in ("x", "digit"):
            return pieces[j].lang
    return pieces[index].lang


def _fill_unknown(pieces: list[Piece]) -> list[Piece]:
    last = len(pieces) - 1
    for i, p in enumerate(pieces):
        if p.lang != "x":
            continue
        if i == 0:
            p.lang = _nearest_lang(pieces, i, search_left=False)
        elif i == last:
            p.lang = _nearest_lang(pieces, i, search_left=True)
        else:
            left_longer = pieces[i - 1].size >= pieces[i + 1].size
            p.lang = _nearest_lang(pieces, i, search_left=left_longer)
    return pieces


def _short_beside_long(cur: Piece, near: Piece) -> bool:
    no_kana = not _has_kana(cur.text) and not _has_kana(near.text)
    near_long_zh = near.size > cur.size and near.size >= 6 and near.lang == "zh"
    return no_kana and (near_long_zh or near.lang in _possible_languages(cur.text))


def _merge_sides(pieces: list[Piece]) -> list[Piece]:
    for index, near_index in ((0, 1), (len(pieces) - 1, len(pieces) - 2)):
        cur = pieces[index]
        merge = cur.lang == "x"
        if len(pieces) >= 2:
            near = pieces[near_index]
            merge = merge or _short_beside_long(cur, near)
            merge = merge or (near.lang in _possible_languages(cur.text) and near.size <= 5)
        if merge:
            cur.lang = _nearest_lang(pieces, index, search_left=index != 0)
    return pieces


def _smart_merge(pieces: list[Piece]) -> list[Piece]:
    pieces = _merge_same(_merge_middle(_merge_same(pieces)))
    pieces = _merge_same(_merge_middle(pieces))
    pieces = _merge_same(_merge_sides(_fill_unknown(pieces)))
    return _merge_same(_merge_middle(pieces))


def _section_pieces(kind: str, text: str) -> list[Piece]:
    if kind == _PUNCT:
        return [Piece("punctuation", text)]
    if kind == _DIGIT:
        return [Piece("digit", text)]
    if kind == _NEWLINE:
        return [Piece("newline", text)]
    if kind == _KO:
        return [Piece("ko", text)]
    if kind == _ZH_JA:
        return _smart_merge([Piece(_zh_ja_lang(w), w) for w in _zh_ja_words(text)])
    return _smart_merge([Piece(_other_lang(w), w) for w in _other_words(text)])


def _merge_across(pieces: list[Piece], marker: str) -> list[Piece]:
    """split-lang's ``_merge_substrings_across_punctuation`` / ``..._newline`` (``marker`` pieces join
    the piece before them; a piece joins the previous output only if the previous input piece had the
    same language)."""
    out: list[Piece] = []
    last_lang = ""
    for p in pieces:
        if not out:
            out.append(p)
        elif p.lang == marker:
            out[-1].add(p.text)
        elif p.lang == last_lang:
            out[-1].add(p.text)
            if out[-1].lang == marker:
                out[-1].lang = p.lang
        else:
            out.append(p)
        last_lang = p.lang
    return out


def _merge_same_kind(sections: list[_Section]) -> list[_Section]:
    out = [sections[0]]
    for s in sections[1:]:
        if s.kind == out[-1].kind:
            out[-1].pieces.extend(s.pieces)
        else:
            out.append(s)
    return out


def _attach_punctuation(sections: list[_Section]) -> list[_Section]:
    out = [sections[0]]
    for cur in sections[1:]:
        prev = out[-1]
        if prev.kind == _PUNCT:  # leading marks go to the next section's first piece
            prev.kind = cur.kind
            prev.pieces[-1].add(cur.pieces[0].text)
            prev.pieces[-1].lang = cur.pieces[0].lang
            prev.pieces.extend(cur.pieces[1:])
        elif cur.kind == _PUNCT:  # other marks go to the end of the previous section
            prev.pieces[-1].add(cur.pieces[0].text)
            prev.pieces.extend(cur.pieces[1:])
        else:
            out.append(cur)
    out = _merge_same_kind(out)
    for s in out:
        s.pieces = _merge_across(s.pieces, "punctuation")
    return out


def _attach_newlines(sections: list[_Section]) -> list[_Section]:
    out = [sections[0]]
    for cur in sections[1:]:
        prev = out[-1]
        if prev.kind == _NEWLINE:
            prev.kind = cur.kind
            prev.pieces.extend(cur.pieces)
        elif cur.kind == _NEWLINE:
            prev.pieces.extend(cur.pieces)
        else:
            out.append(cur)
    out = _merge_same_kind(out)
    for s in out:
        s.pieces = _merge_across(s.pieces, "newline")
    return out


def _special_merge_zh_ja(pieces: list[Piece]) -> list[Piece]:
    """split-lang's ``_special_merge_for_zh_ja``: tiny pieces inside a CJK section join their
    neighbours; mostly-kana sections become Japanese."""
    if len(pieces) == 1:
        return pieces
    count = dict.fromkeys(("zh", "ja", "x", "digit", "punctuation", "newline"), 0)
    out: list[Piece] = []
    i = 0
    while i < len(pieces):
        cur = pieces[i]
        count[cur.lang] = count.get(cur.lang, 0) + cur.size
        if i == 0:
            right = pieces[1]
            if right.lang in ("zh", "ja") and cur.lang in ("zh", "ja", "x") and cur.size * 10 < right.size:
                out.append(Piece(right.lang, cur.text + right.text))
                i += 1
            else:
                out.append(cur)
        elif i == len(pieces) - 1:
            left = out[-1]
            if left.lang in ("zh", "ja") and cur.lang in ("zh", "ja", "x") and cur.size * 10 < left.size:
                left.add(cur.text)
            else:
                out.append(cur)
        else:
            right = pieces[i + 1]
            if (
                out[-1].lang == right.lang
                and right.lang in ("zh", "ja")
                and cur.lang != "en"
                and cur.size * 10 < out[-1].size + right.size
            ):
                out[-1].add(cur.text)
                out[-1].add(right.text)
                i += 1
            else:
                out.append(cur)
        i += 1
    if count["x"] > 0:
        top = max(count, key=count.get)
        for p in out:
            if p.lang == "x":
                p.lang = top
    if count["ja"] >= count["zh"] * 10:
        for p in out:
            if p.lang == "zh":
                p.lang = "ja"
    return _merge_same(out)


def split_by_script(text: str) -> list[Piece]:
    """split-lang's ``split_by_lang`` with the script rule; ``text`` is stripped first.

    Raises :class:`TextFrontendError` when nothing is left (upstream fails with an IndexError).
    """
    text = text.strip()
    if not text:
        raise TextFrontendError("text is empty or only whitespace: nothing to split into languages")
    sections = [_Section(kind, _section_pieces(kind, part)) for kind, part in _pre_split(text)]
    sections = _attach_newlines(_attach_punctuation(sections))
    pieces: list[Piece] = []
    for s in sections:
        pieces.extend(_special_merge_zh_ja(s.pieces) if s.kind == _ZH_JA else s.pieces)
    return pieces
