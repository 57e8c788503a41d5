"""Where the pieces a text is cut into (:func:`.segmentation.split_text`) lie in the text itself.

The cut methods change punctuation only (a run of marks collapsed, an end mark added, ``……`` read as ``。``, a
``。`` or ``.`` removed, pieces of marks alone dropped), never a letter or a digit: the word characters of the
pieces, in order, are those of the text. :func:`piece_spans` walks both by their word characters and gives each
piece its span of the text: the spans tile the text (the first starts at 0, each starts where the one before it
ended, the last ends at its end), a piece's span runs through the marks and closers after its last word character
and the space after them, and the text of a piece that is not spoken (nothing left after normalisation) goes with
the next piece spoken."""

from __future__ import annotations

_CLOSERS = frozenset("\"'”’)）」』】》]")


def _word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def piece_spans(text: str, pieces: list[str]) -> list[tuple[int, int]]:
    """The (start, end) span of ``text`` each of ``pieces`` covers (the pieces in order, cut from ``text``); the
    spans tile ``text``. A piece whose word characters cannot be found in order (a text changed otherwise than
    by its punctuation) ends where the text ends, and the pieces after it get empty spans there."""
    spans: list[tuple[int, int]] = []
    start, pos, n = 0, 0, len(text)
    for k, piece in enumerate(pieces):
        if k == len(pieces) - 1:
            spans.append((start, n))
            break
        found = True
        for ch in piece:
            if not _word(ch):
                continue
            while pos < n and text[pos] != ch:
                pos += 1
            if pos >= n:
                found = False
                break
            pos += 1
        if not found:
            spans.append((start, n))
            start = pos = n
            continue
        end = pos
        while end < n and not _word(text[end]) and not text[end].isspace() and (
                text[end] not in "\"'([{（「『【《“‘" or text[end] in _CLOSERS):
            end += 1  # its marks and closing quotes
        while end < n and text[end].isspace():
            end += 1  # and the space after them
        spans.append((start, end))
        start = pos = end
    return spans


__all__ = ["piece_spans"]
