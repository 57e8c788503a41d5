"""LLM output to speakable prose: the text stage before the front end (``PRIMESPEECH_LLM_TEXT``).

An LLM writes markdown, code, links, emoji, tool calls and (reasoning models) ``<think>`` blocks; a voice
assistant must speak the prose and nothing else. :func:`clean` does it for a whole text; :class:`StreamFilter`
for one session's stream (whole messages, or fragments cut anywhere), carrying an open block from the message
that opens it to the one that closes it; :class:`Sessions` keeps one filter per session. Pure functions of the
text: no front end, engine or node import. A module per thing recognised: :mod:`.blocks` (reasoning and tool
calls, and the bound on open blocks), :mod:`.code` (code fences), :mod:`.markdown` (lines: headings, quotes,
rules), :mod:`.lists` (tables and lists), :mod:`.inline` (emphasis, links, tags, entities), :mod:`.urls` (URLs
and e-mail addresses); :mod:`.phrases` holds what they share, :mod:`.stream` the stage itself.

What each form becomes: docs/dataflow.md ("LLM text"). Plain text is left byte for byte: every transformation
needs unambiguous markup (tests/text/test_llm_parity.py), and every rule is linear in the text
(tests/text/test_linear_time.py, test_redos.py).
"""

from __future__ import annotations

from .blocks import MAX_BLOCK_CHARS, MAX_BLOCK_MESSAGES
from .phrases import language_family
from .stream import Sessions, StreamFilter, clean

__all__ = ["MAX_BLOCK_CHARS", "MAX_BLOCK_MESSAGES", "Sessions", "StreamFilter", "clean", "language_family"]
