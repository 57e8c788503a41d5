"""Reasoning and tool calls (``<think>``, ``<tool_call>`` ... and their closing tags) and code fences (:mod:`.code`):
the blocks a stream carries from the message that opens them to the one that closes them, and the bound on how
long one stays open."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .code import fence_closer, fence_lines
from .phrases import HOLE, SENTENCE_ENDS

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


@dataclass
class OpenBlock:
    kind: str  # "think" | "tool" | "code"
    closer: re.Pattern
    messages: int = 0
    chars: int = 0


def _tag_closer(name: str) -> re.Pattern:
    names = THINK_TAGS if name.lower() in THINK_TAGS else (name.lower(),)
    return re.compile(rf"</({'|'.join(names)})\s*>", re.IGNORECASE)


class Scan:
    """The block tags and fence lines of one text, found once; :meth:`next_opener` walks them in order."""

    def __init__(self, text: str):
        self.text = text
        self.tags = list(_BLOCK_ANY_RE.finditer(text)) if "<" in text else []
        self.fences = fence_lines(text)
        self.last_close: dict[str, int] = {}  # closing tag name -> end of its last occurrence
        for m in self.tags:
            if m.group(1):
                self.last_close[m.group(2).lower()] = m.end()
        self.ti = self.fi = 0

    def _closed_later(self, name: str, end: int) -> bool:
        names = THINK_TAGS if name in THINK_TAGS else (name,)
        return any(self.last_close.get(n, -1) > end for n in names)

    def next_opener(self, pos: int) -> tuple[int, int, OpenBlock | None] | None:
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
                tag = (m.start(), m.end(), OpenBlock("think" if name in THINK_TAGS else "tool", _tag_closer(name)))
                break
        while self.fi < len(self.fences) and self.fences[self.fi][0] < pos:
            self.fi += 1
        fence = None
        if self.fi < len(self.fences):
            start, end, marks = self.fences[self.fi]
            end += 1 if end < len(text) else 0
            fence = (start, end, OpenBlock("code", fence_closer(marks)))
        if tag is None or (fence is not None and fence[0] < tag[0]):
            return fence
        return tag


def _opens_line(text: str, start: int, end: int) -> bool:
    """An opener that is never closed counts where it starts a line (or follows a sentence end or a tag) or ends
    its line; elsewhere (``the <think> tag``) it is a tag named in prose."""
    before = text[:start].rsplit("\n", 1)[-1].rstrip()
    after = text[end:].split("\n", 1)[0].strip()
    return not before or before[-1] in SENTENCE_ENDS + ">" or not after


def strip_stray_tags(text: str) -> str:
    """Block tags that open or close nothing (``the <think> tag``, a ``</tool_call>`` without opener)."""
    return _BLOCK_ANY_RE.sub(HOLE, text) if "<" in text else text
