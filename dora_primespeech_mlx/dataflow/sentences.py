"""From the raw fragments of one streamed utterance to the sentences the node speaks, one at a time.

Two small stages, both fed in order and both pure (no threads, no I/O):

- :class:`LlmFeed` gives the LLM text stage (:class:`..text.llm.StreamFilter`) pieces it reads as whole
  messages: one line, or a line's part through a sentence end and the space after it, held back until complete,
  so the pieces are the same however the text was cut into fragments.
- :class:`SentenceCutter` cuts the spoken text at sentence ends (``。！？!?…``, a ``.`` not inside a number, a
  line break), closing quotes and brackets kept with their sentence. A sentence is released once the character
  after its end mark is known (``3.`` may become ``3.5``), or at the end of the utterance.

Sentences, not clauses: a sentence's audio equals the same sentence's sent whole. Both are linear in their input
however it is cut into fragments: each keeps where it stopped reading (the held text is never read again from its
start), a run of end marks is walked once, not once per mark, and a run of marks is cut at
:data:`MAX_SENTENCE_CHARS` like any other run (tests/text/test_linear_time.py)."""

from __future__ import annotations

import re

from ..text import llm

SENTENCE_ENDS = frozenset("。！？!?…")
FULL_WIDTH_ENDS = frozenset("。！？")
CLOSERS = frozenset("\"'”’)）」』】》]")
MAX_SENTENCE_CHARS = 500  # a run without a sentence end is cut here (at its last space or pause mark)
MAX_HELD_CHARS = 2000  # raw text held for the LLM stage without a line or sentence end is fed anyway
PAUSES = frozenset(",，、;；:： ")
STRAIGHT_QUOTES = frozenset("\"'")
RUN = CLOSERS | SENTENCE_ENDS | {"."}  # what follows an end mark in its sentence
_NUMBER_RE = re.compile(r"\s*\d+\s*")  # a bare number before a ".": a list number (``1.``), not a sentence end


class LlmFeed:
    """The LLM text stage fed with whole lines or sentence-ended parts of lines; ``None`` as the filter passes the
    text through unchanged (``PRIMESPEECH_LLM_TEXT=false``). A message starts a line for the stage (list markers,
    headings, table rows are read at line starts), so a fragment cut in the middle of a word or a marker is held
    back until its line or sentence is complete. Reading is resumed where the last fragment left it."""

    def __init__(self, stream: llm.StreamFilter | None):
        self.stream = stream
        self._raw = ""
        self._scan = _PieceScan()

    @property
    def held(self) -> int:
        """Characters held back (not yet read by the stage)."""
        return len(self._raw)

    def push(self, fragment: str) -> str:
        """Take the next fragment; return the spoken text of what became complete."""
        self._raw += fragment
        spoken, start = [], 0
        while True:
            if len(self._raw) - start > MAX_HELD_CHARS:
                cut = len(self._raw)
            else:
                cut = self._scan.next(self._raw, start)
            if cut == 0:
                break
            spoken.append(self._feed(self._raw[start:cut]))
            start = cut
            self._scan = _PieceScan()
        if start:
            self._raw = self._raw[start:]
        return "".join(spoken)

    def finish(self) -> str:
        """The spoken text of whatever is still held (the end of the utterance)."""
        piece = self._raw
        self.discard()
        return self._feed(piece) if piece else ""

    def discard(self) -> None:
        """Drop what is held (never read by the stage); an open block of the stage stays open."""
        self._raw = ""
        self._scan = _PieceScan()

    def _feed(self, piece: str) -> str:
        spoken = piece if self.stream is None else self.stream.feed(piece)
        if spoken and piece[-1].isspace() and not spoken[-1].isspace():
            spoken += "\n" if piece.endswith("\n") else " "  # keep the next piece apart from this one
        elif spoken and _full_width_end(piece) and not spoken[-1].isspace():
            spoken += " "  # its sentence is complete (the next character was seen): the cutter need not wait
        return spoken


def _full_width_end(piece: str) -> bool:
    """Whether ``piece`` ends with a full-width end mark (and any closers after it)."""
    core = piece.rstrip("".join(CLOSERS))
    return bool(core) and core[-1] in FULL_WIDTH_ENDS


class _PieceScan:
    """Where the first piece of a held line ends, read once: the first line, or (outside a table row, a code fence
    and a code span) the line's part through its first sentence end and the space after it. Pieces depend on the
    text only, never on how it was cut into fragments. :meth:`next` resumes where the last call stopped."""

    def __init__(self):
        self.i = 1  # the next position to look at (its character and the one before it)
        self.ticks = 0  # backticks before ``i``
        self.newline_from = 0  # no line break before this
        self.kind: str | None = None  # "prose" | "other" (a table row, a code fence) once a visible character came
        self.lead = 0  # the line's leading spaces seen so far
        self.walk = 0  # a run of marks was walked up to here (the text after it decides)
        self.number_end = -1  # the end of the line's leading number (``1.``), once known

    def next(self, raw: str, s: int) -> int:
        """The end (an index into ``raw``) of the piece that starts at ``s``, or 0 when none is complete yet."""
        nl = raw.find("\n", s + self.newline_from)
        end = len(raw) if nl < 0 else nl
        self.newline_from = end - s
        whole = 0 if nl < 0 else nl + 1
        if self.kind is None:
            while s + self.lead < end and raw[s + self.lead].isspace():
                self.lead += 1
            if s + self.lead == end:
                return whole
            self.kind = "other" if raw[s + self.lead] in "|`~" else "prose"
        if self.kind == "other":
            return whole
        n = end - s
        i = self.i
        if i == 1 and n > 0:
            self.ticks = raw[s] == "`"
        while i < n:
            prev, ch = raw[s + i - 1], raw[s + i]
            even = not self.ticks % 2
            if even and ch.isspace() and (prev in SENTENCE_ENDS or prev == ".") \
                    and not (prev == "." and self._number(raw, s, i - 1)):
                return s + i + 1
            if even and prev in FULL_WIDTH_ENDS:
                j, pending = _walk(raw, s + max(i, self.walk), s + n, False, None)
                if not pending:
                    return j
                self.i, self.walk = i, j - s  # the text after the run decides
                return whole
            self.ticks += ch == "`"
            i += 1
        self.i = i
        return whole

    def _number(self, raw: str, s: int, i: int) -> bool:
        """Whether the line before the ``.`` at ``s + i`` is a bare number."""
        if self.number_end < 0:
            m = _NUMBER_RE.match(raw, s)
            self.number_end = m.end() - s if m else 0
        return _is_number(raw, s, s + i, s + self.number_end)


def _is_number(text: str, start: int, i: int, number_end: int) -> bool:
    """Whether ``text[start:i]`` is a bare number, ``number_end`` the end of the number run that starts at
    ``start`` (``_NUMBER_RE``; ``start``: none)."""
    return start < i <= number_end and bool(text[start:i].strip())


def _walk(text: str, j: int, n: int, final: bool, limit: int | None) -> tuple[int, bool]:
    """Walk the marks and closers after an end mark from ``j``: (where its sentence ends, whether the text after
    ``n`` decides). A straight quote closes the sentence only when a space or the end follows it; at ``limit``
    the run is cut."""
    while j < n:
        if limit is not None and j >= limit:
            return j, False
        c = text[j]
        if c not in RUN:
            return j, False
        if c in STRAIGHT_QUOTES:
            if j + 1 == n and not final:
                return j, True
            if j + 1 < n and not text[j + 1].isspace():
                return j, False
        j += 1
    return j, not final


class SentenceCutter:
    """Spoken text in, whole sentences out (see the module docstring); reading resumes where it stopped."""

    def __init__(self):
        self._text = ""
        self._reset()

    def _reset(self) -> None:
        self._i = 0  # the next position to look at (the held text starts a sentence)
        self._walk = 0  # a run of marks was walked up to here
        self._number_end = -1  # the end of the sentence's leading number, once known

    def push(self, spoken: str) -> list[str]:
        self._text += spoken
        return self._cut(final=False)

    def finish(self) -> list[str]:
        return self._cut(final=True)

    def discard(self) -> None:
        self._text = ""
        self._reset()

    @property
    def pending(self) -> str:
        return self._text

    def _cut(self, final: bool) -> list[str]:
        """The complete sentences of the held text (stripped, empty ones dropped); the rest stays held."""
        text, out = self._text, []
        start, i, n = 0, self._i, len(self._text)
        while i < n:
            ch = text[i]
            end = None
            if ch == "\n":
                end = i + 1
            elif ch in SENTENCE_ENDS or ch == ".":
                if ch == "." and self._number(text, start, i):
                    end = None
                else:
                    j, pending = _walk(text, max(i + 1, self._walk), n, final, start + MAX_SENTENCE_CHARS)
                    if pending:
                        self._walk = j
                        break  # what follows the mark decides (a number, more marks, a closing quote)
                    self._walk = j
                    if j - start >= MAX_SENTENCE_CHARS or j == n or ch != "." or text[j].isspace():
                        end = j
            if end is not None:
                _add(out, text[start:end])
                start = i = end
                self._number_end = -1
                continue
            if i - start >= MAX_SENTENCE_CHARS:
                cut = _long_cut(text, start, i)
                _add(out, text[start:cut])
                start = cut
                self._number_end = -1
            i += 1
        if final:
            _add(out, text[start:])
            start = n
        self._text = text[start:]
        self._i = i - start if i > start else 0
        self._walk = max(0, self._walk - start)
        if final or not self._text:
            self._reset()
        return out

    def _number(self, text: str, start: int, i: int) -> bool:
        if self._number_end < 0:  # relative to the sentence's start
            m = _NUMBER_RE.match(text, start)
            self._number_end = m.end() - start if m else 0
        return _is_number(text, start, i, start + self._number_end)


def _long_cut(text: str, start: int, i: int) -> int:
    """Where to cut a run of ``MAX_SENTENCE_CHARS`` without a sentence end: after its last pause or space."""
    for k in range(i, start, -1):
        if text[k] in PAUSES:
            return k + 1
    return i + 1


def _add(out: list[str], sentence: str) -> None:
    sentence = sentence.strip()
    if sentence:
        out.append(sentence)


__all__ = ["LlmFeed", "SentenceCutter", "MAX_SENTENCE_CHARS"]
