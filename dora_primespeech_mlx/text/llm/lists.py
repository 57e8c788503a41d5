"""Tables and lists: a table row becomes its cells as phrases (its separator row goes), list markers (bullets,
numbers, task boxes, footnote definitions) go, a bold label's colon becomes a pause."""

from __future__ import annotations

import re

from .inline import spoken_inline
from .phrases import CJK_END, ENDED, drop_holes, pause_mark

_BULLET_RE = re.compile(r"^[ \t]*[-*+][ \t]+(?:\[[ xX]\][ \t]+)?(?=\S)")
_NUMBERED_RE = re.compile(r"^[ \t]*\d{1,3}[.)][ \t]+(?=\S)")
# a list number alone on its line: what a sentence segmenter cuts off "1. Open the app." in a stream
NUMBER_ONLY_RE = re.compile(r"[ \t]*\d{1,3}[.)][ \t]*")
TABLE_ROW_RE = re.compile(r"^[ \t]*\|.*\|[ \t]*$")
_TABLE_SEP_CELL_RE = re.compile(r"^[ \t]*:?-+:?[ \t]*$")
# a separator row without outer pipes ("---|:---:"): the rows around it are a table's, pipes or not
TABLE_SEP_RE = re.compile(r"[ \t]*(?:\|[ \t]*)?:?-{3,}:?[ \t]*(?:\|[ \t]*:?-{3,}:?[ \t]*)+(?:\|[ \t]*)?$")
# a line that is one bold span ("**1. 准备材料**", "**Step 2:**"): a heading in all but name
BOLD_LINE_RE = re.compile(r"[ \t]*(\*\*|__)(?=\S)[^\n]{1,300}(?<=\S)\1[ \t]*(?:[:：][ \t]*)?$")

_FOOTNOTE_DEF_RE = re.compile(r"^[ \t]{0,3}\[\^[^\]\s]+\]:[ \t]*")


def table_row(line: str, family: str) -> str:
    cells = line.strip().strip("|").split("|")
    if all(_TABLE_SEP_CELL_RE.match(c) for c in cells):
        return ""
    spoken = [drop_holes(spoken_inline(c, family)).strip() for c in cells]
    spoken = [c for c in spoken if any(ch.isalnum() for ch in c)]
    out = ""
    for cell in spoken[:-1]:
        if cell[-1] not in ENDED:
            cell += pause_mark(cell, family)
        out += cell + ("" if CJK_END.match(cell[-1]) or cell[-1] in "，、；：。！？" else " ")
    return out + (spoken[-1] if spoken else "")


def bold_label(body: str, family: str) -> str:
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
    return f"{mark}{label}{mark}{pause_mark(label, family)} {rest.lstrip(' :：')}"


def list_item(body: str) -> str:
    """A line without its list markers: bullets ("-", "*", "+", task boxes), numbers ("1.", "2)": dropped, not
    read: the English front end reads "1. " as "first,"), footnote definitions; nested markers ("- 1. ", "1. - ")
    go together."""
    for _ in range(4):
        marker = _BULLET_RE.match(body) or _NUMBERED_RE.match(body) or _FOOTNOTE_DEF_RE.match(body)
        if not marker:
            break
        body = body[marker.end():]
    return body
