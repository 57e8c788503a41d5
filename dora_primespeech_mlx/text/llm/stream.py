"""The stage itself: :class:`StreamFilter` (one stream's messages, or fragments cut anywhere, with the open block
carried between them), :func:`clean` (a whole text) and :class:`Sessions` (a filter per session)."""

from __future__ import annotations

import re
from collections import OrderedDict

from .blocks import MAX_BLOCK_CHARS, MAX_BLOCK_MESSAGES, OpenBlock, Scan, strip_stray_tags
from .markdown import spoken_markdown
from .phrases import as_phrase, language_family


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
        self._block: OpenBlock | None = None
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
        return "".join(as_phrase(line, family) + "\n" for line in spoken.split("\n") if line.strip())

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
        spoken, self._table = spoken_markdown(outside, language_family(self.lang_hint, text), self._table)
        if outside != text:  # blocks became line breaks: no blank lines at the ends, at most one between
            spoken = re.sub(r"\n[ \t]*(?:\n[ \t]*)+", "\n\n", spoken).strip()
        return spoken

    def _split_blocks(self, text: str) -> str:
        """``text`` with every block (and the open one's part) replaced by a line break. Linear in the text: the
        candidate tags and fences are found once."""
        if self._block is None and "<" not in text and "`" not in text and "~" not in text:
            return text
        scan = Scan(text)
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
                pieces.append(strip_stray_tags(text[pos:]))
                break
            start, end, block = found
            if block is None:  # a closing think tag with no opener: what came before it is reasoning
                pieces = ["\n"]
                pos = end
                continue
            pieces.append(strip_stray_tags(text[pos:start]) + "\n")
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
