"""Code blocks: fence lines (3+ backticks or tildes, at most a language tag) open a block that the same fence, as long
or longer, closes."""

from __future__ import annotations

import re

# a fence line: 3+ backticks or tildes, then at most a language tag ("python", "c++", "{.js}"), nothing else;
# the line is taken apart by fence_lines (one pass per line), these match its pieces
_FENCE_START_RE = re.compile(r"[ \t]*(?:>[ \t]?)*(`{3,}|~{3,})")
_FENCE_INFO_RE = re.compile(r"[\w+#.-]*(?:[ \t]*\{[^}\n]*\})?")


def fence_closer(fence: str) -> re.Pattern:
    ch = re.escape(fence[0])
    return re.compile(rf"^[ \t]*(?:>[ \t]?)*{ch}{{{len(fence)},}}[ \t]*$\n?", re.MULTILINE)


def fence_lines(text: str) -> list[tuple[int, int, str]]:
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
