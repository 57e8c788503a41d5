"""Markdown outside blocks, line by line: rules, headings, quotes and link definitions, then each line's tables and
lists (:mod:`.lists`) and inline forms (:mod:`.inline`); every line followed by more text ends as a phrase."""

from __future__ import annotations

import re

from .inline import spoken_inline
from .lists import BOLD_LINE_RE, NUMBER_ONLY_RE, TABLE_ROW_RE, TABLE_SEP_RE, bold_label, list_item, table_row
from .phrases import HOLE, LEADING_EMOJI_RE, as_phrase, drop_holes

# -- line forms -----------------------------------------------------------------------------------------
_HR_RE = re.compile(r"^[ \t]{0,3}(?:(?:\*[ \t]*){3,}|(?:-[ \t]*){3,}|(?:_[ \t]*){3,}|={3,}[ \t]*)$")
# a heading's opening marks; _heading_text strips its closing ones
_HEADING_RE = re.compile(r"[ \t]{0,3}#{1,6}[ \t]+")
_QUOTE_RE = re.compile(r"^[ \t]{0,3}(?:>[ \t]?)+")

_LINK_DEF_RE = re.compile(r"^[ \t]{0,3}\[(?!\^)[^\]\n]+\]:[ \t]+\S+.*$")


def _line(line: str, family: str, table: bool = False) -> str:
    """The spoken form of one line outside any block. ``table``: the line belongs to a table (its separator
    row was seen). A line without markup comes back as it is."""
    if _HR_RE.match(line) or _LINK_DEF_RE.match(line) or TABLE_SEP_RE.match(line):
        return ""
    if TABLE_ROW_RE.match(line) or (table and "|" in line):
        return table_row(line, family)
    body = line
    quote = _QUOTE_RE.match(body)
    if quote:
        body = body[quote.end():]
        if _HR_RE.match(body):
            return ""
    if NUMBER_ONLY_RE.fullmatch(body):
        return ""
    heading = _HEADING_RE.match(body)
    if heading:
        body = _heading_text(body[heading.end():])
    else:
        body = bold_label(list_item(body), family)
    if heading or BOLD_LINE_RE.match(body):  # "## 1. Setup", "**2. 开始制作**": the number goes as an item's
        body = list_item(spoken_inline(body, family))
    else:
        body = spoken_inline(body, family)
    return "" if NUMBER_ONLY_RE.fullmatch(body) else body  # "## 2." or "**1." cut off by a segmenter


def _heading_text(rest: str) -> str:
    """A heading's text after its opening marks: without trailing spaces and closing marks ("Title ##")."""
    rest = rest.rstrip(" \t")
    bare = rest.rstrip("#")
    if bare != rest and bare[-1:] in (" ", "\t"):
        return bare.rstrip(" \t")
    return rest


def spoken_markdown(text: str, family: str, table: bool = False) -> tuple[str, bool]:
    """The spoken form of text outside blocks, line by line, and whether a table is still open at its end
    (``table``: one is open at its start); a text without markup comes back byte for byte. In a text with markup,
    every line followed by more text ends with a mark the front ends read as a pause (:func:`as_phrase`): a
    heading, list item or table row is a phrase of its own, and no word is glued to the next line's first (the
    front ends drop line breaks). The last line needs none: the front end ends every text with one."""
    out: list[str] = []
    changed = False
    lines_in = text.split("\n")
    header = {i - 1 for i, line in enumerate(lines_in) if i and "|" in line and TABLE_SEP_RE.match(line)}
    for i, line in enumerate(lines_in):
        if TABLE_SEP_RE.match(line):
            table = True
        elif "|" not in line:
            table = False
        spoken = _line(line, family, table or i in header)
        spoken = drop_holes(spoken) if spoken != line or HOLE in line else LEADING_EMOJI_RE.sub("", line)
        if spoken != line:
            changed = True
            if not spoken.strip():
                spoken = ""
        out.append(spoken)
    if not changed:
        return text, table
    last = max((i for i, spoken in enumerate(out) if spoken.strip()), default=-1)
    lines = [spoken if i >= last or not spoken.strip() else
             "\n".join(as_phrase(part, family) for part in spoken.split("\n"))
             for i, spoken in enumerate(out)]
    joined = re.sub(r"\n{3,}", "\n\n", "\n".join(lines))
    return (joined.strip("\n") if joined.strip() else ""), table
