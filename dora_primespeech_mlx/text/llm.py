"""LLM output to speakable prose: the text stage before the front end (``PRIMESPEECH_LLM_TEXT``).

An LLM writes markdown, code, links, emoji, tool calls and (reasoning models) ``<think>`` blocks; a voice
assistant must speak the prose and nothing else. :func:`clean` does it for a whole text; :class:`StreamFilter`
for one session's stream (whole messages, or fragments cut anywhere), carrying an open block from the message
that opens it to the one that closes it; :class:`Sessions` keeps one filter per session. Pure functions of the
text: no front end, engine or node import.

What each form becomes: docs/dataflow.md ("LLM text"). Plain text is left byte for byte: every transformation
needs unambiguous markup (tests/text/test_llm_parity.py), and every rule is linear in the text
(tests/text/test_linear_time.py, test_redos.py).
"""

from __future__ import annotations

import html
import re
from collections import OrderedDict
from dataclasses import dataclass

# -- the bound on open blocks -----------------------------------------------------------------------------
#: A block (reasoning, tool call, code) still open after this many messages of one stream is closed: a model that
#: never closes it (truncated output, a stray tag) would otherwise silence the rest of the question.
MAX_BLOCK_MESSAGES = 400
#: ... or after this many characters inside it. Both are above the length of reasoning traces of current models
#: (a few thousand to ~20,000 characters), so reasoning is not spoken; a new question and ``reset`` clear it anyway.
MAX_BLOCK_CHARS = 40_000

THINK_TAGS = ("think", "thinking", "reasoning")
TOOL_TAGS = ("tool_call", "tool_calls", "function_call", "function_calls", "tool_use", "tool_result",
             "tool_response")
_BLOCK_NAMES = "|".join(sorted(THINK_TAGS + TOOL_TAGS, key=len, reverse=True))
_BLOCK_OPEN_RE = re.compile(rf"<({_BLOCK_NAMES})(?:\s[^<>\n]*)?>", re.IGNORECASE)
_BLOCK_ANY_RE = re.compile(rf"<(/?)({_BLOCK_NAMES})(?:\s[^<>\n]*)?(/?)>", re.IGNORECASE)
# a fence line: 3+ backticks or tildes, then at most a language tag ("python", "c++", "{.js}"), nothing else;
# the line is taken apart by _fence_lines (one pass per line), these match its pieces
_FENCE_START_RE = re.compile(r"[ \t]*(?:>[ \t]?)*(`{3,}|~{3,})")
_FENCE_INFO_RE = re.compile(r"[\w+#.-]*(?:[ \t]*\{[^}\n]*\})?")

SENTENCE_ENDS = "。！？.!?…"
PAUSE_MARKS = ",，、;；:："
_ENDED = set(SENTENCE_ENDS + PAUSE_MARKS + "~～")
_CJK_END = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f]")
_HANGUL = re.compile(r"[\u1100-\u11ff\u3130-\u318f\uac00-\ud7af]")
_KANA = re.compile(r"[\u3040-\u30ff\uff66-\uff9f]")
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")

# -- line forms -----------------------------------------------------------------------------------------
_HR_RE = re.compile(r"^[ \t]{0,3}(?:(?:\*[ \t]*){3,}|(?:-[ \t]*){3,}|(?:_[ \t]*){3,}|={3,}[ \t]*)$")
# a heading's opening marks; _heading_text strips its closing ones
_HEADING_RE = re.compile(r"[ \t]{0,3}#{1,6}[ \t]+")
_QUOTE_RE = re.compile(r"^[ \t]{0,3}(?:>[ \t]?)+")
_BULLET_RE = re.compile(r"^[ \t]*[-*+][ \t]+(?:\[[ xX]\][ \t]+)?(?=\S)")
_NUMBERED_RE = re.compile(r"^[ \t]*\d{1,3}[.)][ \t]+(?=\S)")
# a list number alone on its line: what a sentence segmenter cuts off "1. Open the app." in a stream
_NUMBER_ONLY_RE = re.compile(r"[ \t]*\d{1,3}[.)][ \t]*")
_TABLE_ROW_RE = re.compile(r"^[ \t]*\|.*\|[ \t]*$")
_TABLE_SEP_CELL_RE = re.compile(r"^[ \t]*:?-+:?[ \t]*$")
# a separator row without outer pipes ("---|:---:"): the rows around it are a table's, pipes or not
_TABLE_SEP_RE = re.compile(r"[ \t]*(?:\|[ \t]*)?:?-{3,}:?[ \t]*(?:\|[ \t]*:?-{3,}:?[ \t]*)+(?:\|[ \t]*)?$")
# a line that is one bold span ("**1. 准备材料**", "**Step 2:**"): a heading in all but name
_BOLD_LINE_RE = re.compile(r"[ \t]*(\*\*|__)(?=\S)[^\n]{1,300}(?<=\S)\1[ \t]*(?:[:：][ \t]*)?$")
_LINK_DEF_RE = re.compile(r"^[ \t]{0,3}\[(?!\^)[^\]\n]+\]:[ \t]+\S+.*$")
_FOOTNOTE_DEF_RE = re.compile(r"^[ \t]{0,3}\[\^[^\]\s]+\]:[ \t]*")

# -- inline forms ---------------------------------------------------------------------------------------
_CODE_SPAN_RE = re.compile(r"(`{1,16})(?!`)(.{1,1000}?)(?<!`)\1(?!`)")
_IMAGE_RE = re.compile(r"!\[([^\]\n]{0,300})\]\((?:[^()\s]|\([^()\s]*\))*(?:[ \t]+\"[^\"\n]*\")?\)")
_LINK_RE = re.compile(r"\[([^\]\n]{1,300})\]\((?:[^()\s]|\([^()\s]*\))*(?:[ \t]+\"[^\"\n]*\")?\)")
_REF_LINK_RE = re.compile(r"(?<!\])\[([^\]\n^][^\]\n]{0,300})\]\[[^\]\n]{0,100}\]")
_FOOTNOTE_RE = re.compile(r"\[\^[^\]\s]{1,100}\]")
_AUTOLINK_RE = re.compile(r"<((?:https?|ftp)://[^\s<>]+|mailto:[^\s<>]+|[\w.+-]+@[\w-]+(?:\.[\w-]+)+)>")
_HTML_BLOCK_TAGS = ("address|article|aside|blockquote|br|caption|dd|details|div|dl|dt|figcaption|figure|footer|"
                    "h[1-6]|header|hr|li|ol|p|pre|section|summary|table|tbody|td|tfoot|th|thead|tr|ul")
_HTML_INLINE_TAGS = ("a|abbr|b|big|cite|code|del|dfn|em|font|i|img|ins|kbd|mark|q|s|samp|small|span|strike|"
                     "strong|sub|sup|time|tt|u|var")
_HTML_ATTRS = r"(?:\s+[A-Za-z_:][\w:.-]*\s*=\s*(?:\"[^\"<>]*\"|'[^'<>]*'|[^\s\"'<>=`]+))*\s*/?"
_HTML_BLOCK_RE = re.compile(rf"</?(?:{_HTML_BLOCK_TAGS}){_HTML_ATTRS}>", re.IGNORECASE)
_HTML_INLINE_RE = re.compile(rf"</?(?:{_HTML_INLINE_TAGS}){_HTML_ATTRS}>", re.IGNORECASE)
_ENTITY_RE = re.compile(r"&(?:#\d{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});")
_ESCAPE_RE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|~<>])")
_STRONG_RE = re.compile(r"\*\*(?=\S)(.{1,300}?)(?<=\S)\*\*")
_UNDER_STRONG_RE = re.compile(r"(?<![A-Za-z0-9_])__(?=\S)(.{1,300}?)(?<=\S)__(?![A-Za-z0-9_])")
# single * and _: the emphasised words start with a word character (or a quote/bracket) and end with one (or a
# sentence mark), so "^_^", "3 * 4 * 5" and "~_~" stay
_EM_OPEN = r"(?=[\w\"'“‘(（])"
_EM_CLOSE = r"(?<=[\w.!?。！？)）\"'”’])"
_EM_RE = re.compile(rf"(?<![A-Za-z0-9*\\])\*{_EM_OPEN}(.{{1,300}}?){_EM_CLOSE}\*(?![A-Za-z0-9*])")
_UNDER_EM_RE = re.compile(rf"(?<![A-Za-z0-9_\\])_{_EM_OPEN}(.{{1,300}}?){_EM_CLOSE}_(?![A-Za-z0-9_])")
_STRIKE_RE = re.compile(r"~~(?=\S)(.{1,300}?)(?<=\S)~~")
# a "**" left over from emphasis cut between two messages (never between two ASCII letters or digits: 2**3)
_LONE_STRONG_RE = re.compile(r"(?<![A-Za-z0-9*])\*\*(?=\S)(?!\*)|(?<=\S)(?<!\*)\*\*(?![A-Za-z0-9*])")

_URL_STOP = "\\s<>()\\[\\]{}\"'，。！？、；：（）【】「」『』《》"
_URL_RE = re.compile(rf"(?<![A-Za-z0-9_@/.])(?:(?:https?|ftp)://|www\.)[^{_URL_STOP}]+")
_EMAIL_RE = re.compile(r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@([A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,})"
                       r"(?![A-Za-z0-9-]|\.[A-Za-z0-9])")

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
_LEADING_EMOJI_RE = re.compile(rf"^[ \t]*(?:[{_EMOJI_CHARS}][ \t]*)+(?:[{PAUSE_MARKS}]+[ \t]*|$)")
_HOLE = "\uE000"  # stands where something unspeakable was removed, until the pauses around it are tidied
# a run of holes from its first hole on (the spaces before it are taken by a scan), its spaces and pause marks
_HOLES_RE = re.compile(rf"{_HOLE}(?:[ \t]*{_HOLE})*([ \t]*)([{PAUSE_MARKS}]*)[ \t]*")

# reading of a domain's dots and of "@", per language family
_DOT = {"zh": " 点 ", "yue": " dot ", "ja": " ドット ", "ko": " 닷 ", "en": " dot "}
_AT = {"zh": " 艾特 ", "yue": " at ", "ja": " アット ", "ko": None, "en": " at "}


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
        return "。" if _CJK_END.search(phrase) else "."
    return "。" if family in ("zh", "yue", "ja") else "."


def _as_phrase(phrase: str, family: str) -> str:
    """``phrase`` ended with a mark every front end reads as a pause: a sentence mark when it has none (and has
    something to speak); a closing colon or semicolon becomes a comma (the English front end drops ":" and ";",
    which glued "You will need:" to the next line's first word)."""
    stripped = phrase.rstrip()
    if not stripped or not any(ch.isalnum() for ch in stripped):
        return stripped
    if stripped[-1] in ":;：；":
        return stripped[:-1] + _pause(stripped[:-1], family)
    if stripped[-1] in _ENDED:
        return stripped
    return stripped + _end_mark(stripped, family)


def _pause(text: str, family: str) -> str:
    """The pause mark after ``text``: by its last letter, "、" in Japanese, "，" in Chinese, "," otherwise."""
    for ch in reversed(text):
        if ch.isalpha():
            if not _CJK_END.match(ch):
                return ","
            return "、" if family == "ja" or _KANA.search(text) else "，"
    return ","


def _domain_words(host: str, family: str) -> str:
    """A host name (or an e-mail's user part) with its dots read: "example dot com"."""
    host = host.removeprefix("www.").removeprefix("WWW.").strip(".")
    return _DOT[family].join(part for part in host.split(".") if part)


def _url_words(url: str, family: str) -> tuple[str, str]:
    """(the domain as words, the trailing sentence punctuation the URL pattern swallowed)."""
    tail = ""
    while url and url[-1] in ".,;:!?":
        tail, url = url[-1] + tail, url[:-1]
    rest = re.sub(r"^(?:(?:https?|ftp)://)", "", url, flags=re.IGNORECASE)
    host = re.split(r"[/?#]", rest, maxsplit=1)[0].rsplit("@", 1)[-1].split(":", 1)[0]
    return _domain_words(host, family), tail


def _spaced(words: str, before: str, after: str) -> str:
    """``words`` with the spaces it needs between neighbours that are letters of a spaced script."""
    words = words.strip()
    lead = " " if before and before[-1].isalnum() and not _CJK_END.match(before[-1]) else ""
    trail = " " if after and after[0].isalnum() and not _CJK_END.match(after[0]) else ""
    return lead + words + trail


def _replace_urls(line: str, family: str) -> str:
    def url(m: re.Match) -> str:
        words, tail = _url_words(m.group(0), family)
        return _spaced(words, m.string[: m.start()], m.string[m.end():]) + tail if words else _HOLE + tail

    def email(m: re.Match) -> str:
        at = _AT[family]
        if at is None:
            return m.group(0)
        user = m.group(0).split("@", 1)[0]
        words = _domain_words(user, family) + at + _domain_words(m.group(1), family)
        return _spaced(words, m.string[: m.start()], m.string[m.end():])

    def autolink(m: re.Match) -> str:
        target = m.group(1)
        if target.lower().startswith("mailto:"):
            target = target[7:]
        if "@" in target and "://" not in target:
            return _EMAIL_RE.sub(email, target)
        return _url_words(target, family)[0]

    line = _AUTOLINK_RE.sub(autolink, line)
    line = _URL_RE.sub(url, line)
    return _EMAIL_RE.sub(email, line)


def _inline(line: str, family: str) -> str:
    """Inline markup of one line: code spans keep their text (the other rules do not look inside them), links
    their text, emphasis marks go, tags go, entities are decoded, URLs and e-mails become words."""
    parts = _CODE_SPAN_RE.split(line)  # text, ticks, code, text, ticks, code, ..., text
    if len(parts) == 1:
        return _inline_text(line, family)
    return "".join(_inline_text(p, family) if i % 3 == 0 else p.strip() if i % 3 == 2 else ""
                   for i, p in enumerate(parts))


def _drop_comments(line: str) -> str:
    """HTML comments (``<!-- ... -->``) replaced by a hole; an unclosed one is left as it is."""
    out, pos = [], 0
    while True:
        start = line.find("<!--", pos)
        end = line.find("-->", start + 4) if start >= 0 else -1
        if start < 0 or end < 0:
            return "".join(out) + line[pos:]
        out.append(line[pos:start] + _HOLE)
        pos = end + 3


def _inline_text(line: str, family: str) -> str:
    # each rule runs only where its mark is present (the text is scanned once per rule that can apply)
    if "<!--" in line:
        line = _drop_comments(line)
    if "](" in line:
        line = _IMAGE_RE.sub(lambda m: m.group(1).strip() or _HOLE, line)
        line = _LINK_RE.sub(lambda m: m.group(1), line)
    if "][" in line:
        line = _REF_LINK_RE.sub(lambda m: m.group(1), line)
    if "[^" in line:
        line = _FOOTNOTE_RE.sub("", line)
    if "://" in line or "www." in line or "@" in line or "<" in line:
        line = _replace_urls(line, family)
    if "<" in line:
        line = _HTML_BLOCK_RE.sub("\n", line)
        line = _HTML_INLINE_RE.sub("", line)
    for mark, pattern in (("**", _STRONG_RE), ("__", _UNDER_STRONG_RE), ("~~", _STRIKE_RE), ("*", _EM_RE),
                          ("_", _UNDER_EM_RE), ("**", _LONE_STRONG_RE)):
        if mark in line:
            line = pattern.sub(lambda m: m.group(1) if m.groups() else "", line)
    if "\\" in line:
        line = _ESCAPE_RE.sub(lambda m: m.group(1), line)
    if "&" in line:
        line = _ENTITY_RE.sub(lambda m: html.unescape(m.group(0)).replace("\xa0", " "), line)
    return line


def _table_row(line: str, family: str) -> str:
    cells = line.strip().strip("|").split("|")
    if all(_TABLE_SEP_CELL_RE.match(c) for c in cells):
        return ""
    spoken = [_drop_holes(_inline(c, family)).strip() for c in cells]
    spoken = [c for c in spoken if any(ch.isalnum() for ch in c)]
    out = ""
    for cell in spoken[:-1]:
        if cell[-1] not in _ENDED:
            cell += _pause(cell, family)
        out += cell + ("" if _CJK_END.match(cell[-1]) or cell[-1] in "，、；：。！？" else " ")
    return out + (spoken[-1] if spoken else "")


def _line(line: str, family: str, table: bool = False) -> str:
    """The spoken form of one line outside any block. ``table``: the line belongs to a table (its separator
    row was seen). A line without markup comes back as it is."""
    if _HR_RE.match(line) or _LINK_DEF_RE.match(line) or _TABLE_SEP_RE.match(line):
        return ""
    if _TABLE_ROW_RE.match(line) or (table and "|" in line):
        return _table_row(line, family)
    body = line
    quote = _QUOTE_RE.match(body)
    if quote:
        body = body[quote.end():]
        if _HR_RE.match(body):
            return ""
    if _NUMBER_ONLY_RE.fullmatch(body):
        return ""
    heading = _HEADING_RE.match(body)
    if heading:
        body = _heading_text(body[heading.end():])
    else:
        body = _bold_label(_list_item(body), family)
    if heading or _BOLD_LINE_RE.match(body):  # "## 1. Setup", "**2. 开始制作**": the number goes as an item's
        body = _list_item(_inline(body, family))
    else:
        body = _inline(body, family)
    return "" if _NUMBER_ONLY_RE.fullmatch(body) else body  # "## 2." or "**1." cut off by a segmenter


def _heading_text(rest: str) -> str:
    """A heading's text after its opening marks: without trailing spaces and closing marks ("Title ##")."""
    rest = rest.rstrip(" \t")
    bare = rest.rstrip("#")
    if bare != rest and bare[-1:] in (" ", "\t"):
        return bare.rstrip(" \t")
    return rest


def _bold_label(body: str, family: str) -> str:
    """A bold label opening a line ("**Step 1:** Download", "**注意**：保持"): its colon becomes a pause mark,
    which every front end reads (the English one drops ":", gluing the label to the text)."""
    mark = body[:2]
    if mark not in ("**", "__"):
        return body
    end = body.find(mark, 2)
    if end < 0:
        return body
    label, rest = body[2:end].rstrip(), body[end + 2:]
    if not (label.endswith((":", "：")) or rest.startswith((":", "："))) or not rest.strip(" \t:："):
        return body
    label = label.rstrip(":：").rstrip()
    return f"{mark}{label}{mark}{_pause(label, family)} {rest.lstrip(' :：')}"


def _list_item(body: str) -> str:
    """A line without its list markers: bullets ("-", "*", "+", task boxes), numbers ("1.", "2)": dropped, not
    read: the English front end reads "1. " as "first,"), footnote definitions; nested markers ("- 1. ", "1. - ")
    go together."""
    for _ in range(4):
        marker = _BULLET_RE.match(body) or _NUMBERED_RE.match(body) or _FOOTNOTE_DEF_RE.match(body)
        if not marker:
            break
        body = body[marker.end():]
    return body


def _drop_holes(text: str) -> str:
    """Remove emoji and the marks of removed things with the spaces and pause marks they leave behind."""
    if _HOLE not in text and not _EMOJI_RUN_RE.search(text):
        return text
    text = _EMOJI_RUN_RE.sub(lambda m: m.group(0).replace(m.group(0).strip(" \t"), _HOLE), text)
    out: list[str] = []
    pos, blank = 0, True  # blank: the line up to ``pos`` is only whitespace
    while (hole := text.find(_HOLE, pos)) >= 0:
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
    if _CJK_END.match(before) or _CJK_END.match(after):
        return ""
    return " " if spaced or (before.isalnum() and after.isalnum()) else ""


def _markdown(text: str, family: str, table: bool = False) -> tuple[str, bool]:
    """The spoken form of text outside blocks, line by line, and whether a table is still open at its end
    (``table``: one is open at its start); a text without markup comes back byte for byte. In a text with markup,
    every line followed by more text ends with a mark the front ends read as a pause (:func:`_as_phrase`): a
    heading, list item or table row is a phrase of its own, and no word is glued to the next line's first (the
    front ends drop line breaks). The last line needs none: the front end ends every text with one."""
    out: list[str] = []
    changed = False
    lines_in = text.split("\n")
    header = {i - 1 for i, line in enumerate(lines_in) if i and "|" in line and _TABLE_SEP_RE.match(line)}
    for i, line in enumerate(lines_in):
        if _TABLE_SEP_RE.match(line):
            table = True
        elif "|" not in line:
            table = False
        spoken = _line(line, family, table or i in header)
        spoken = _drop_holes(spoken) if spoken != line or _HOLE in line else _LEADING_EMOJI_RE.sub("", line)
        if spoken != line:
            changed = True
            if not spoken.strip():
                spoken = ""
        out.append(spoken)
    if not changed:
        return text, table
    last = max((i for i, spoken in enumerate(out) if spoken.strip()), default=-1)
    lines = [spoken if i >= last or not spoken.strip() else
             "\n".join(_as_phrase(part, family) for part in spoken.split("\n"))
             for i, spoken in enumerate(out)]
    joined = re.sub(r"\n{3,}", "\n\n", "\n".join(lines))
    return (joined.strip("\n") if joined.strip() else ""), table


@dataclass
class _Block:
    kind: str  # "think" | "tool" | "code"
    closer: re.Pattern
    messages: int = 0
    chars: int = 0


def _tag_closer(name: str) -> re.Pattern:
    names = THINK_TAGS if name.lower() in THINK_TAGS else (name.lower(),)
    return re.compile(rf"</({'|'.join(names)})\s*>", re.IGNORECASE)


def _fence_closer(fence: str) -> re.Pattern:
    ch = re.escape(fence[0])
    return re.compile(rf"^[ \t]*(?:>[ \t]?)*{ch}{{{len(fence)},}}[ \t]*$\n?", re.MULTILINE)


class StreamFilter:
    """The spoken part of each message of one stream (one session's question): :meth:`feed` takes the messages
    in order and carries an open reasoning, tool-call or code block from the message that opens it to the one
    that closes it. A message starts a line. A block open for more than ``max_messages`` messages or
    ``max_chars`` characters is closed (:data:`MAX_BLOCK_MESSAGES`, :data:`MAX_BLOCK_CHARS`; ``overflows``
    counts it) and the messages after it are spoken.

    A text arriving in fragments cut anywhere (LLM tokens) goes through :meth:`feed_fragment` and :meth:`flush`:
    ``feed_fragment`` returns the spoken form of the messages the fragment completes, each line ended with a pause
    mark and a line break ("" while none is complete); ``flush`` returns the rest at the text's end. Messages are
    cut by the text alone (:class:`_Cutter`), so for every cut of a text into fragments the returns joined equal
    ``feed_fragment(text) + flush()``, and speak as :func:`clean` does."""

    def __init__(self, lang_hint: str | None = None, max_messages: int | None = MAX_BLOCK_MESSAGES,
                 max_chars: int | None = MAX_BLOCK_CHARS):
        self.lang_hint = lang_hint
        self.max_messages = max_messages
        self.max_chars = max_chars
        self._block: _Block | None = None
        self._table = False  # a table's separator row was seen and its rows go on
        self.overflows = 0
        self._cutter = _Cutter()

    @property
    def in_block(self) -> str | None:
        """"think", "tool" or "code" while a block is open, else None."""
        return self._block.kind if self._block is not None else None

    def reset(self) -> None:
        self._block = None
        self._table = False
        self._cutter = _Cutter()

    def feed_fragment(self, fragment: str) -> str:
        """The spoken form of the messages that ``fragment`` completes, each followed by a line break ("" while
        none is complete): for a text that arrives in pieces cut anywhere (an LLM's tokens). The text is cut
        into messages at line breaks and sentence ends, by the text alone (:class:`_Cutter`), so the
        concatenation of what the fragments return and :meth:`flush` returns is the same for every way of
        cutting the text, and the same as ``feed_fragment(text) + flush()``. A stream uses either this or
        :meth:`feed`: a message fed whole does not wait for fragment text still pending."""
        if not isinstance(fragment, str):
            raise TypeError(f"fragment must be a str, not {type(fragment).__name__}")
        return "".join(self._spoken_line(m) for m in self._cutter.push(fragment))

    def flush(self) -> str:
        """The spoken form of the rest of a text fed with :meth:`feed_fragment` (its end has come)."""
        return "".join(self._spoken_line(m) for m in self._cutter.finish())

    def _spoken_line(self, message: str) -> str:
        """A message's spoken form, its lines ended with pause marks (concatenated, no word glues to the next
        message's first), and a line break after it; "" when there is nothing to speak."""
        spoken = self.feed(message)
        if not spoken.strip():
            return ""
        family = language_family(self.lang_hint, spoken)
        return "".join(_as_phrase(line, family) + "\n" for line in spoken.split("\n") if line.strip())

    def feed(self, text: str) -> str:
        """The spoken form of the next message ("" when it is only markup or reasoning)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, not {type(text).__name__}")
        block = self._block
        if block is not None and (
            (self.max_messages is not None and block.messages >= self.max_messages)
            or (self.max_chars is not None and block.chars >= self.max_chars)
        ):
            self._block = None
            self.overflows += 1
        outside = self._split_blocks(text)
        spoken, self._table = _markdown(outside, language_family(self.lang_hint, text), self._table)
        if outside != text:  # blocks became line breaks: no blank lines at the ends, at most one between
            spoken = re.sub(r"\n[ \t]*(?:\n[ \t]*)+", "\n\n", spoken).strip()
        return spoken

    def _split_blocks(self, text: str) -> str:
        """``text`` with every block (and the open one's part) replaced by a line break. Linear in the text: the
        candidate tags and fences are found once."""
        if self._block is None and "<" not in text and "`" not in text and "~" not in text:
            return text
        scan = _Scan(text)
        pieces: list[str] = []
        pos, n = 0, len(text)
        if self._block is not None:
            self._block.messages += 1
        while pos < n:
            if self._block is not None:
                m = self._block.closer.search(text, pos)
                end = n if m is None else m.start()
                self._block.chars += end - pos
                if m is None:
                    return "".join(pieces) + ("\n" if pieces else "")
                pos, self._block = m.end(), None
                pieces.append("\n")
                continue
            found = scan.next_opener(pos)
            if found is None:
                pieces.append(_strip_stray_tags(text[pos:]))
                break
            start, end, block = found
            if block is None:  # a closing think tag with no opener: what came before it is reasoning
                pieces = ["\n"]
                pos = end
                continue
            pieces.append(_strip_stray_tags(text[pos:start]) + "\n")
            self._block, pos = block, end
            block.messages = 1
        return "".join(pieces)


class _Cutter:
    """Cuts a text arriving in fragments into messages: at line breaks (dropped), after a run of "。！？…", and
    after a run of ".!?" followed by whitespace; never inside an open code span, link text or target, or tag of
    the line, nor right after a line-start list number ("1." of "1. Open the app"). Whether a position is a cut
    depends on the text up to the next character only, so the messages are the same however the text is cut
    into fragments. Each character is looked at once."""

    _CJK_ENDS = frozenset("。！？…")
    _ASCII_ENDS = frozenset(".!?")
    _CLOSERS = frozenset("」』”’）)】》\"'")

    def __init__(self) -> None:
        self._chars: list[str] = []
        self._after_end = ""  # "cjk" / "ascii": the characters so far end with a run of sentence marks
        self._ticks = self._brackets = self._parens = self._angles = 0

    def push(self, fragment: str) -> list[str]:
        out: list[str] = []
        for ch in fragment:
            if ch == "\n":
                out.append(self._take())
                continue
            if self._after_end == "cjk" and ch not in self._CJK_ENDS and ch not in self._CLOSERS and self._open():
                out.append(self._take())
            elif self._after_end == "ascii" and ch in " \t\u3000" and self._open():
                out.append(self._take())
            self._chars.append(ch)
            self._track(ch)
        return out

    def finish(self) -> list[str]:
        rest = self._take()
        return [rest] if rest else []

    def _track(self, ch: str) -> None:
        if ch in self._CJK_ENDS:
            self._after_end = "cjk"
        elif ch in self._ASCII_ENDS:
            self._after_end = "ascii" if self._after_end != "cjk" else "cjk"
        elif ch not in self._CLOSERS:
            self._after_end = ""
        if ch == "`":
            self._ticks ^= 1
        elif ch == "[":
            self._brackets += 1
        elif ch == "]":
            self._brackets = max(0, self._brackets - 1)
        elif ch == "(":
            self._parens += 1
        elif ch == ")":
            self._parens = max(0, self._parens - 1)
        elif ch == "<":
            self._angles = 1
        elif ch == ">":
            self._angles = 0

    def _open(self) -> bool:
        """Whether the message so far may end here (nothing of the line left open, not a bare list number)."""
        if self._ticks or self._brackets or self._parens or self._angles:
            return False
        if len(self._chars) <= 12 and _LIST_NUMBER_RE.fullmatch("".join(self._chars)):
            return False
        return True

    def _take(self) -> str:
        message = "".join(self._chars).strip(" \t")
        self._chars = []
        self._after_end = ""
        self._ticks = self._brackets = self._parens = self._angles = 0
        return message


# a list number with the marks that may come before it on its line ("1.", "  2)", "## 3.", "**4.")
_LIST_NUMBER_RE = re.compile(r"[ \t#>*_+-]{0,8}\d{1,3}[.)]")


class _Scan:
    """The block tags and fence lines of one text, found once; :meth:`next_opener` walks them in order."""

    def __init__(self, text: str):
        self.text = text
        self.tags = list(_BLOCK_ANY_RE.finditer(text)) if "<" in text else []
        self.fences = _fence_lines(text)
        self.last_close: dict[str, int] = {}  # closing tag name -> end of its last occurrence
        for m in self.tags:
            if m.group(1):
                self.last_close[m.group(2).lower()] = m.end()
        self.ti = self.fi = 0

    def _closed_later(self, name: str, end: int) -> bool:
        names = THINK_TAGS if name in THINK_TAGS else (name,)
        return any(self.last_close.get(n, -1) > end for n in names)

    def next_opener(self, pos: int) -> tuple[int, int, _Block | None] | None:
        """(start, end, block) of the first block opener from ``pos`` (block None: an orphan ``</think>``)."""
        text, tag = self.text, None
        while self.ti < len(self.tags) and self.tags[self.ti].start() < pos:
            self.ti += 1
        for i in range(self.ti, len(self.tags)):
            m = self.tags[i]
            closing, name, selfclosing = m.group(1), m.group(2).lower(), m.group(3)
            if selfclosing:
                continue
            if closing:
                if name in THINK_TAGS:
                    tag = (m.start(), m.end(), None)
                    break
                continue
            if self._closed_later(name, m.end()) or _opens_line(text, m.start(), m.end()):
                tag = (m.start(), m.end(), _Block("think" if name in THINK_TAGS else "tool", _tag_closer(name)))
                break
        while self.fi < len(self.fences) and self.fences[self.fi][0] < pos:
            self.fi += 1
        fence = None
        if self.fi < len(self.fences):
            start, end, marks = self.fences[self.fi]
            end += 1 if end < len(text) else 0
            fence = (start, end, _Block("code", _fence_closer(marks)))
        if tag is None or (fence is not None and fence[0] < tag[0]):
            return fence
        return tag


def _fence_lines(text: str) -> list[tuple[int, int, str]]:
    """(start, end, fence marks) of every fence line of ``text``: 3+ backticks or tildes at the line's start
    (after spaces and quote marks), then at most an info string ("python", "c++", "{.js}"; no backtick after a
    backtick fence). One pass over the lines that hold a fence's marks."""
    found, start, n = [], 0, len(text)
    while start <= n:
        end = text.find("\n", start)
        end = n if end < 0 else end
        if "```" in text[start:end] or "~~~" in text[start:end]:
            m = _FENCE_START_RE.match(text, start, end)
            if m:
                info = text[m.end():end].strip(" \t")
                if _FENCE_INFO_RE.fullmatch(info) and not (m.group(1)[0] == "`" and "`" in info):
                    found.append((start, end, m.group(1)))
        start = end + 1
    return found


def _opens_line(text: str, start: int, end: int) -> bool:
    """An opener that is never closed counts where it starts a line (or follows a sentence end or a tag) or ends
    its line; elsewhere (``the <think> tag``) it is a tag named in prose."""
    before = text[:start].rsplit("\n", 1)[-1].rstrip()
    after = text[end:].split("\n", 1)[0].strip()
    return not before or before[-1] in SENTENCE_ENDS + ">" or not after


def _strip_stray_tags(text: str) -> str:
    """Block tags that open or close nothing (``the <think> tag``, a ``</tool_call>`` without opener)."""
    return _BLOCK_ANY_RE.sub(_HOLE, text) if "<" in text else text


def clean(text: str, lang_hint: str | None = None) -> str:
    """The spoken form of a whole text: reasoning, tool calls and code blocks removed (an unclosed one runs to
    the end of the text), markdown, links, URLs and emoji turned into prose. ``lang_hint`` is a language option
    ("zh", "all_ja", "en", "auto", ...) choosing the readings of URLs and e-mails and the sentence marks of
    phrases without letters; None or "auto": the text's scripts decide. Text without markup is returned as it
    is."""
    return StreamFilter(lang_hint, max_messages=None, max_chars=None).feed(text)


class Sessions:
    """One :class:`StreamFilter` per session, restarted when the session's question changes (the node keys them
    by the ``session_id`` and ``question_id`` metadata). At most ``max_sessions`` are kept (the least recently
    used goes first), so hostile metadata cannot grow it."""

    def __init__(self, lang_hint: str | None = None, max_sessions: int = 64):
        self.lang_hint = lang_hint
        self.max_sessions = max_sessions
        self._filters: OrderedDict[str, tuple[str, StreamFilter]] = OrderedDict()

    def get(self, session: object, question: object) -> StreamFilter:
        key, q = str(session), str(question)
        found = self._filters.pop(key, None)
        if found is None or found[0] != q:
            found = (q, StreamFilter(self.lang_hint))
        self._filters[key] = found
        while len(self._filters) > self.max_sessions:
            self._filters.popitem(last=False)
        return found[1]

    def reset(self) -> None:
        """Forget every open block (``reset``)."""
        self._filters.clear()

    def forget(self, session: object) -> None:
        """Forget the open blocks of one session (a cancel of that session)."""
        self._filters.pop(str(session), None)


__all__ = ["MAX_BLOCK_CHARS", "MAX_BLOCK_MESSAGES", "Sessions", "StreamFilter", "clean", "language_family"]
