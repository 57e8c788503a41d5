"""What counts as speakable: a letter or a digit of any script (Unicode categories L* and N*). The old node
skipped text that is only punctuation, symbols or whitespace; the node and the engine both use this rule."""

from __future__ import annotations

import unicodedata


def has_speakable(text: str) -> bool:
    """True if ``text`` has a letter or a digit."""
    return any(unicodedata.category(ch)[0] in "LN" for ch in text)
