"""From the raw fragments of one streamed utterance to the sentences the node speaks, one at a time.

Two small stages, both fed in order and both pure (no threads, no I/O):

- :class:`LlmFeed` gives the LLM text stage (:class:`..text.llm.StreamFilter`) pieces it reads as whole
  messages: one line, or a line's part through a sentence end and the space after it, held back until complete,
  so the pieces are the same however the text was cut into fragments.
- :class:`SentenceCutter` cuts the spoken text at sentence ends (``。！？!?…``, a ``.`` not inside a number, a
  line break), closing quotes and brackets kept with their sentence. A sentence is released once the character
  after its end mark is known (``3.`` may become ``3.5``), or at the end of the utterance.

Sentences, not clauses: each sentence is synthesised as a text of its own, so its audio equals the audio of the
same sentence sent whole (the engine cuts it further with ``TEXT_SPLIT_METHOD``); a clause would change it."""

from __future__ import annotations

from ..text import llm

SENTENCE_ENDS = frozenset("。！？!?…")
FULL_WIDTH_ENDS = frozenset("。！？")
CLOSERS = frozenset("\"'”’)）」』】》]")
MAX_SENTENCE_CHARS = 500  # a run without a sentence end is cut here (at its last space or pause mark)
MAX_HELD_CHARS = 2000  # raw text held for the LLM stage without a line or sentence end is fed anyway
PAUSES = frozenset(",，、;；:： ")
STRAIGHT_QUOTES = frozenset("\"'")


class LlmFeed:
    """The LLM text stage fed with whole lines or sentence-ended parts of lines; ``None`` as the filter passes the
    text through unchanged (``PRIMESPEECH_LLM_TEXT=false``). A message starts a line for the stage (list markers,
    headings, table rows are read at line starts), so a fragment cut in the middle of a word or a marker is held
    back until its line or sentence is complete."""

    def __init__(self, stream: llm.StreamFilter | None):
        self.stream = stream
        self._raw = ""

    def push(self, fragment: str) -> str:
        """Take the next fragment; return the spoken text of what became complete."""
        self._raw += fragment
        spoken = []
        while True:
            cut = len(self._raw) if len(self._raw) > MAX_HELD_CHARS else _next_piece(self._raw)
            if cut == 0:
                return "".join(spoken)
            piece, self._raw = self._raw[:cut], self._raw[cut:]
            spoken.append(self._feed(piece))

    def finish(self) -> str:
        """The spoken text of whatever is still held (the end of the utterance)."""
        piece, self._raw = self._raw, ""
        return self._feed(piece) if piece else ""

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


def _next_piece(raw: str) -> int:
    """The length of the first piece of ``raw`` the stage may read now (0: none yet): its first line, or (outside
    a table row, a code fence and a code span) the line's part through its first sentence end and the space
    after it. Pieces depend on the text only, never on how it was cut into fragments."""
    nl = raw.find("\n")
    line = raw if nl < 0 else raw[:nl]
    if not line.lstrip().startswith(("|", "`", "~")):
        for i in range(1, len(line)):
            if line[i].isspace() and _sentence_end(line, i - 1, len(line), False) == i and not line[:i].count("`") % 2:
                return i + 1
            # a full-width end mark (Chinese, Japanese) is followed by no space: its sentence is complete once
            # the next character (not a closer or another mark) is there
            if line[i - 1] in FULL_WIDTH_ENDS and not line[:i].count("`") % 2:
                end = _sentence_end(line, i - 1, len(line), False)
                if end is not None and 0 < end < len(line):
                    return end
    return nl + 1


def _sentence_end(text: str, i: int, n: int, final: bool, start: int = 0) -> int | None:
    """Where the sentence that began at ``start`` ends if ``text[i]`` is its end mark (after the marks and closers
    that follow it); None if ``text[i]`` ends no sentence, -1 if the text after it (not there yet) decides. A "."
    ends one only before a space or a line break (``3.5``, ``example.com`` do not), and not after a bare list
    number (``1. Update``); a straight quote closes a sentence only when a space or the end follows it."""
    ch = text[i]
    if ch not in SENTENCE_ENDS and ch != ".":
        return None
    if ch == "." and text[start:i].strip().isdigit():
        return None
    j = i + 1
    while j < n and (text[j] in CLOSERS or text[j] in SENTENCE_ENDS or text[j] == "."):
        if text[j] in STRAIGHT_QUOTES:
            if j + 1 == n and not final:
                return -1
            if j + 1 < n and not text[j + 1].isspace():
                break
        j += 1
    if j == n:
        return j if final else -1
    if ch == "." and not text[j].isspace():
        return None
    return j


class SentenceCutter:
    """Spoken text in, whole sentences out (see the module docstring)."""

    def __init__(self):
        self._text = ""

    def push(self, spoken: str) -> list[str]:
        self._text += spoken
        out, self._text = _cut(self._text, final=False)
        return out

    def finish(self) -> list[str]:
        out, self._text = _cut(self._text, final=True)
        return out

    @property
    def pending(self) -> str:
        return self._text


def _cut(text: str, final: bool) -> tuple[list[str], str]:
    """The complete sentences of ``text`` (stripped, empty ones dropped) and the rest."""
    out: list[str] = []
    start, i, n = 0, 0, len(text)
    while i < n:
        end = i + 1 if text[i] == "\n" else _sentence_end(text, i, n, final, start)
        if end == -1:
            break  # what follows the mark decides (a number, more marks, a closing quote)
        if end is not None:
            _add(out, text[start:end])
            start = i = end
            continue
        if i - start >= MAX_SENTENCE_CHARS:
            cut = _long_cut(text, start, i)
            _add(out, text[start:cut])
            start = cut
        i += 1
    rest = text[start:]
    if final:
        _add(out, rest)
        rest = ""
    return out, rest


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
