"""Pinyin syllable -> (initial, final) phone pair of the opencpop "strict" inventory.

The original front end reads this map from ``opencpop-strict.txt`` (429 lines, "pinyin<TAB>initial
final"). Here it is generated: a table of which finals each initial takes, plus the spelling rules
of the phone set:

* zero-initial syllables get a dummy initial by their first letter: a* -> ``AA``, e* -> ``EE``,
  o* -> ``OO``; ``y``/``w`` stay initials (``yi`` -> y i, ``wo`` -> w o);
* ``ü`` is ``v``: after j/q/x/y the spelled ``u`` is ``v`` (``ju`` -> j v, ``yuan`` -> y van), and
  those syllables are also listed spelled with ``v`` (``jv``, ``yvan``);
* ``i`` after z/c/s is ``i0``, after zh/ch/sh/r it is ``ir``;
* after ``y``: ``an`` -> ``En`` and ``e`` -> ``E`` (yan, ye).

``opencpop_lines()`` gives the lines of the original file, in its order.
"""

from __future__ import annotations

from functools import cache

# Finals (as spelled in pinyin, after the initial) each initial combines with.
_SYLLABLES = {
    "": "a ai an ang ao e ei en eng er o ou",
    "b": "a ai an ang ao ei en eng i ian iao ie in ing o u",
    "c": "a ai an ang ao e ei en eng i ong ou u uan ui un uo",
    "ch": "a ai an ang ao e en eng i ong ou u ua uai uan uang ui un uo",
    "d": "a ai an ang ao e ei en eng i ia ian iao ie ing iu ong ou u uan ui un uo",
    "f": "a an ang ei en eng o ou u",
    "g": "a ai an ang ao e ei en eng ong ou u ua uai uan uang ui un uo",
    "h": "a ai an ang ao e ei en eng ong ou u ua uai uan uang ui un uo",
    "j": "i ia ian iang iao ie in ing iong iu u uan ue un",
    "k": "a ai an ang ao e ei en eng ong ou u ua uai uan uang ui un uo",
    "l": "a ai an ang ao e ei eng i ia ian iang iao ie in ing iu o ong ou u uan un uo v ve",
    "m": "a ai an ang ao e ei en eng i ian iao ie in ing iu o ou u",
    "n": "a ai an ang ao e ei en eng i ian iang iao ie in ing iu ong ou u uan un uo v ve",
    "p": "a ai an ang ao ei en eng i ian iao ie in ing o ou u",
    "q": "i ia ian iang iao ie in ing iong iu u uan ue un",
    "r": "an ang ao e en eng i ong ou u ua uan ui un uo",
    "s": "a ai an ang ao e en eng i ong ou u uan ui un uo",
    "sh": "a ai an ang ao e ei en eng i ou u ua uai uan uang ui un uo",
    "t": "a ai an ang ao e ei eng i ian iao ie ing ong ou u uan ui un uo",
    "w": "a ai an ang ei en eng o u",
    "x": "i ia ian iang iao ie in ing iong iu u uan ue un",
    "y": "a an ang ao e i in ing o ong ou u uan ue un",
    "z": "a ai an ang ao e ei en eng i ong ou u uan ui un uo",
    "zh": "a ai an ang ao e ei en eng i ong ou u ua uai uan uang ui un uo",
}

_ZERO_INITIAL = {"a": "AA", "e": "EE", "o": "OO"}
_U_IS_V = {"j", "q", "x", "y"}  # initials after which a spelled "u" is ü


def _phones(initial: str, final: str) -> tuple[str, str]:
    """The (initial, final) phones of a syllable spelled ``initial + final``."""
    if not initial:
        return _ZERO_INITIAL[final[0]], final
    if initial in _U_IS_V and final.startswith("u"):
        final = "v" + final[1:]
    if final == "i" and initial in {"z", "c", "s"}:
        final = "i0"
    elif final == "i" and initial in {"zh", "ch", "sh", "r"}:
        final = "ir"
    elif initial == "y" and final in {"an", "e"}:
        final = {"an": "En", "e": "E"}[final]
    return initial, final


@cache
def _entries() -> tuple[tuple[str, tuple[str, str]], ...]:
    rows = []  # (sort key, pinyin, phones)
    for initial, finals in _SYLLABLES.items():
        for final in finals.split():
            key, phones = initial + final, _phones(initial, final)
            rows.append(((key, 0), key, phones))
            if initial in _U_IS_V and final.startswith("u"):
                # also reachable spelled with v (pypinyin's ü): jv, yvan, ... listed after the u twin
                rows.append(((key, 1), initial + "v" + final[1:], phones))
    return tuple((key, phones) for _, key, phones in sorted(rows))


@cache
def pinyin_to_phones() -> dict[str, tuple[str, str]]:
    """Pinyin without tone (``"zhi"``, ``"yuan"``, ``"jv"``) -> (initial phone, final phone)."""
    return dict(_entries())


def opencpop_lines() -> list[str]:
    """The map as the lines of ``opencpop-strict.txt`` (``"a\\tAA a"``), in file order."""
    return [f"{key}\t{initial} {final}" for key, (initial, final) in _entries()]
