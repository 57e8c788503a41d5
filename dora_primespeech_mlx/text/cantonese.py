"""Cantonese front end (upstream ``text/cantonese.py``, model version v2).

* :func:`text_normalize`: the **Chinese** normaliser (:mod:`.zh_normalization`: numbers read as
  Mandarin characters, traditional -> simplified, ...), then Cantonese punctuation rules: ``：；，、·``
  -> ``,``, ``。`` -> ``.``, ``！`` -> ``!``, ``？`` -> ``?``, ``$`` -> ``.``, quotes and brackets ->
  ``'``, ``—～~`` -> ``-``, then everything outside U+4E00-U+9FA5 and ``! ? … , . -`` is deleted.
  Repeated marks are not collapsed.
* :func:`g2p`: the Jyutping of every character from ToJyutping (extra ``yue``; word context picks
  the reading of polyphones), split into initial and final+tone with upstream's ``INITIALS`` list, each
  written with a ``Y`` prefix (``係`` hai6 -> ``Yh Yai6``); marks stay as they are. ``word2ph`` is 2 per
  character and 1 per mark.
"""

from __future__ import annotations

import re
import threading

from .chinese import _ascii_digits
from .errors import TextFrontendError
from .extras import import_extra
from .zh_normalization import normalize

PUNCTUATION = ("!", "?", "…", ",", ".", "-")

# upstream's list, in its order: the first entry that prefixes a syllable is its "initial"
INITIALS = (
    "aa aai aak aap aat aau ai au ap at ak a p b e ts t dz d kw k gw g f h l m ng n s y w c z j "
    "ong on ou oi ok o uk ung sp spl spn sil"
).split()

_PUNCT_MAP = {
    "：": ",", "；": ",", "，": ",", "。": ".", "！": "!", "？": "?", "\n": ".", "·": ",", "、": ",",
    "...": "…", "$": ".", "“": "'", "”": "'", '"': "'", "‘": "'", "’": "'", "（": "'", "）": "'",
    "(": "'", ")": "'", "《": "'", "》": "'", "【": "'", "】": "'", "[": "'", "]": "'", "—": "-",
    "～": "-", "~": "-", "「": "'", "」": "'",
}  # fmt: skip
_PUNCT_MAP_RE = re.compile("|".join(re.escape(k) for k in _PUNCT_MAP))
_PUNCT_CLASS = re.escape("".join(PUNCTUATION))
_NOT_KEPT_RE = re.compile(rf"[^\u4e00-\u9fa5{_PUNCT_CLASS}]+")
_ONLY_PUNCT_RE = re.compile(rf"^[{_PUNCT_CLASS}]+$")
_JYUTPING_RE = re.compile(r"^([a-z]+[1-6]+[ ]?)+$")

_lock = threading.Lock()
_tojyutping = None


def _module():
    global _tojyutping
    with _lock:
        if _tojyutping is None:
            _tojyutping = import_extra("yue", "ToJyutping")
        return _tojyutping


def replace_punctuation(text: str) -> str:
    text = _PUNCT_MAP_RE.sub(lambda m: _PUNCT_MAP[m.group()], text)
    return _NOT_KEPT_RE.sub("", text)


def text_normalize(text: str) -> str:
    return "".join(replace_punctuation(s) for s in normalize(_ascii_digits(text)))


def jyutping(text: str) -> list[str]:
    """Jyutping syllables (``"hai6"``) and marks of normalised text, in order."""
    out: list[str] = []
    for word, reading in _module().get_jyutping_list(text):
        if _ONLY_PUNCT_RE.match(word):
            out.extend(ch for ch in word)
            continue
        if not isinstance(reading, str) or not _JYUTPING_RE.search(reading):
            raise TextFrontendError(f"yue: no Jyutping for {word!r} ({reading!r})")
        out.append(reading)
    return out


def syllables_to_phones(syllables: list[str]) -> tuple[list[str], list[int]]:
    """Upstream ``jyuping_to_initials_finals_tones``: ("Y" + initial, "Y" + final + tone) per syllable."""
    phones: list[str] = []
    word2ph: list[int] = []
    for syllable in syllables:
        if syllable in PUNCTUATION or syllable == "_":
            phones.append(syllable if syllable in PUNCTUATION else "Y_")
            word2ph.append(1)
            continue
        if syllable[-1:].isdigit() and syllable[-1].isascii():
            tone, base = int(syllable[-1]), syllable[:-1]
        else:
            tone, base = 0, syllable
        for initial in INITIALS:
            if base.startswith(initial):
                if base.startswith("nga"):
                    initial, final = base[:2], base[2:] or base[-1]
                else:
                    final = base[len(initial) :] or initial[-1]
                phones.append(_tag(initial))
                phones.append(_tag(f"{final}{tone}" if tone != 0 else final))
                word2ph.append(2)
                break
    return phones, word2ph


def _tag(phone: str) -> str:
    return phone if phone in PUNCTUATION else "Y" + phone


def g2p(norm_text: str) -> tuple[list[str], list[int]]:
    return syllables_to_phones(jyutping(norm_text))
