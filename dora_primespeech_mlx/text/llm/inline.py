"""Inline markdown and HTML of one line: code spans keep their text, links and images their text, emphasis marks,
tags, footnote marks and comments go, entities and escapes are decoded, URLs become words (:mod:`.urls`)."""

from __future__ import annotations

import html
import re

from .phrases import HOLE
from .urls import replace_urls

# -- inline forms ---------------------------------------------------------------------------------------
_CODE_SPAN_RE = re.compile(r"(`{1,16})(?!`)(.{1,1000}?)(?<!`)\1(?!`)")
_IMAGE_RE = re.compile(r"!\[([^\]\n]{0,300})\]\((?:[^()\s]|\([^()\s]*\))*(?:[ \t]+\"[^\"\n]*\")?\)")
_LINK_RE = re.compile(r"\[([^\]\n]{1,300})\]\((?:[^()\s]|\([^()\s]*\))*(?:[ \t]+\"[^\"\n]*\")?\)")
_REF_LINK_RE = re.compile(r"(?<!\])\[([^\]\n^][^\]\n]{0,300})\]\[[^\]\n]{0,100}\]")
_FOOTNOTE_RE = re.compile(r"\[\^[^\]\s]{1,100}\]")

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


def spoken_inline(line: str, family: str) -> str:
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
        out.append(line[pos:start] + HOLE)
        pos = end + 3


def _inline_text(line: str, family: str) -> str:
    # each rule runs only where its mark is present (the text is scanned once per rule that can apply)
    if "<!--" in line:
        line = _drop_comments(line)
    if "](" in line:
        line = _IMAGE_RE.sub(lambda m: m.group(1).strip() or HOLE, line)
        line = _LINK_RE.sub(lambda m: m.group(1), line)
    if "][" in line:
        line = _REF_LINK_RE.sub(lambda m: m.group(1), line)
    if "[^" in line:
        line = _FOOTNOTE_RE.sub("", line)
    if "://" in line or "www." in line or "@" in line or "<" in line:
        line = replace_urls(line, family)
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
