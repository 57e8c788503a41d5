"""Phoneme symbol tables of GPT-SoVITS (v1: 322 symbols, v2: 732 symbols) and the id mapping.

The tables are built from their definition (docs/model.md, "Symbol tables"): v1 is the code-point sorted set
of pad + Chinese initials + toned finals + Japanese + punctuation/specials + ARPAbet; v2 is v1, then
``[`` ``]``, the sorted Korean jamo and the sorted Cantonese (Jyutping, "Y…") symbols. v1 is an exact
prefix of v2. Every model version other than "v1" (v2, v2Pro, v3, v4) uses the v2 table.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from .errors import TextFrontendError

PAD = "_"
PUNCTUATION = ["!", "?", "…", ",", ".", "-"]
SPECIALS = ["SP", "SP2", "SP3", "UNK"]

# Chinese: 26 initials (AA/EE/OO stand for zero initials) and 39 finals, each with tones 1-5.
ZH_INITIALS = (
    "AA EE OO b c ch d f g h j k l m n p q r s sh t w x y z zh"
).split()
ZH_FINALS = (
    "E En a ai an ang ao e ei en eng er i i0 ia ian iang iao ie in ing iong ir iu "
    "o ong ou u ua uai uan uang ui un uo v van ve vn"
).split()
ZH_TONES = "12345"

JA_SYMBOLS = (
    "I N U a b by ch cl d dy e f g gy h hy i j k ky m my n ny o p py r ry s sh t ts u v w y z"
).split()

ARPABET = (
    "AA0 AA1 AA2 AE0 AE1 AE2 AH0 AH1 AH2 AO0 AO1 AO2 AW0 AW1 AW2 AY0 AY1 AY2 B CH D DH EH0 EH1 EH2 "
    "ER ER0 ER1 ER2 EY0 EY1 EY2 F G HH IH IH0 IH1 IH2 IY0 IY1 IY2 JH K L M N NG OW0 OW1 OW2 OY0 OY1 "
    "OY2 P R S SH T TH UH0 UH1 UH2 UW0 UW1 UW2 V W Y Z ZH"
).split()

# v2 additions: Japanese pitch marks, Korean jamo (+ 空 "space" and 停 "pause"), Cantonese.
JA_PITCH_MARKS = ["[", "]"]
KO_SYMBOLS = "ㄱㄴㄷㄹㅁㅂㅅㅇㅈㅊㅋㅌㅍㅎㄲㄸㅃㅆㅉㅏㅓㅗㅜㅡㅣㅐㅔ空停"
# Cantonese: "Y" + Jyutping part. These finals occur with each of the tones 1-6 ...
YUE_TONED = (
    "a aa aai aak aam aan aang aap aat aau ai ak am an ang ap at au e ei ek eng eoi eon eot g i ik im "
    "in ing ip it iu k m n o oe oek oeng oi ok on ong ot ou p t u ui uk un ung ut yu yun yut"
).split()
YUE_TONES = "123456"
# ... and these parts (initials and some finals) also occur without a tone.
YUE_UNTONED = "a aa ai ak au b c d e f g gw h j k kw l m n ng o oi ok on ou p s t uk w z".split()

V1_COUNT = 322
V2_COUNT = 732


def _zh_finals_with_tones() -> list[str]:
    return [final + tone for tone in ZH_TONES for final in ZH_FINALS]


def _yue_symbols() -> set[str]:
    toned = {"Y" + part + tone for part in YUE_TONED for tone in YUE_TONES}
    return toned | {"Y" + part for part in YUE_UNTONED}


@functools.cache
def symbols_v1() -> tuple[str, ...]:
    table = [PAD, *ZH_INITIALS, *_zh_finals_with_tones(), *JA_SYMBOLS, *PUNCTUATION, *SPECIALS, *ARPABET]
    result = tuple(sorted(set(table)))
    assert len(result) == V1_COUNT, len(result)
    return result


@functools.cache
def symbols_v2() -> tuple[str, ...]:
    result = (*symbols_v1(), *JA_PITCH_MARKS, *sorted(KO_SYMBOLS), *sorted(_yue_symbols()))
    assert len(result) == V2_COUNT, len(result)
    return result


def table_version(version: str) -> str:
    """Which table a model version uses: "v1" for v1, "v2" for every other version."""
    return "v1" if version == "v1" else "v2"


def symbols(version: str = "v2") -> tuple[str, ...]:
    """The symbol list of ``version`` (index = id)."""
    return symbols_v1() if table_version(version) == "v1" else symbols_v2()


@functools.cache
def _symbol_to_id(table: str) -> dict[str, int]:
    return {s: i for i, s in enumerate(symbols(table))}


def symbol_to_id(version: str = "v2") -> dict[str, int]:
    """symbol -> id for ``version`` (a shared dict: do not modify)."""
    return _symbol_to_id(table_version(version))


def cleaned_text_to_sequence(phones: Iterable[str], version: str = "v2") -> list[int]:
    """Phone symbols -> ids (upstream ``text.cleaned_text_to_sequence``)."""
    mapping = symbol_to_id(version)
    ids = []
    for ph in phones:
        try:
            ids.append(mapping[ph])
        except KeyError:
            table = table_version(version)
            raise TextFrontendError(f"phone {ph!r} is not in the {table} symbol table") from None
    return ids
