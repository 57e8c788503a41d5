"""Hostile input for the English number rules: every pattern runs in linear time on long digit, punctuation and
whitespace runs (the amount-after-number patterns were cubic in a digit run: ~130 s at 3 000 digits), and each
rewritten pattern gives exactly the substitutions of upstream's pattern on ordinary text.

The timing checks run in a child process with a wall-clock limit, so a super-linear pattern fails the test in
seconds instead of hanging it."""

from __future__ import annotations

import random
import re
import subprocess
import sys
import textwrap

import pytest

from dora_primespeech_mlx.text import en_normalization as en
from dora_primespeech_mlx.text.zh_normalization import numbers as zh

# Upstream's patterns (GPT-SoVITS text/en_normalization/expend.py), as this module had them before they were
# made linear; the rewritten ones must substitute exactly as these do.
_UPSTREAM_OPERAND = r"((-?)((\d+)(\.\d+)?[⁰¹²³⁴⁵⁶⁷⁸⁹ˣʸⁿ]*)|(\.\d+[⁰¹²³⁴⁵⁶⁷⁸⁹ˣʸⁿ]*)|([A-Za-z][⁰¹²³⁴⁵⁶⁷⁸⁹ˣʸⁿ]*))"
UPSTREAM = {
    "_POUNDS_BEFORE": r"£([0-9.,]*[0-9]+)",
    "_POUNDS_AFTER": r"([0-9.,]*[0-9]+)£",
    "_DOLLARS_BEFORE": r"\$([0-9.,]*[0-9]+)",
    "_DOLLARS_AFTER": r"([(0-9.,]*[0-9]+)\$",
    "_DECIMAL": r"([0-9]+\.\s*[0-9]+)",
    "_FRACTION": r"([0-9]+/[0-9]+)",
    "_ORDINAL": r"[0-9]+(st|nd|rd|th)",
    "_ARITHMETIC": _UPSTREAM_OPERAND + r"\s+([-+×÷=])\s+" + _UPSTREAM_OPERAND,
    "_NEGATIVE": r"(?:^|\s+)(-)(\d+)",
}
ALPHABET = list("0123456789") * 3 + list(".,£$( -+=×/:\t\nabAst²٣") + ["nd", "rd", "th", "  "]

_ZH_OPERAND = rf"((-?)((\d+)(\.\d+)?[{zh._POWERS}]*)|(\.\d+[{zh._POWERS}]*)|([A-Za-z][{zh._POWERS}]*))"
ZH_UPSTREAM = {  # GPT-SoVITS text/zh_normalization/num.py
    "RE_FRAC": r"(-?)(\d+)/(\d+)",
    "RE_PERCENTAGE": r"(-?)(\d+(\.\d+)?)%",
    "RE_ASMD": _ZH_OPERAND + r"([\+\-×÷=])" + _ZH_OPERAND,
    "RE_DECIMAL_NUM": r"(-?)((\d+)(\.\d+))|(\.(\d+))",
    "RE_POSITIVE_QUANTIFIERS": r"(\d+)([多余几\+])?(" + "|".join(zh._QUANTIFIERS) + ")",
    "RE_VERSION_NUM": r"((\d+)(\.\d+)(\.\d+)?(\.\d+)+)",
    "RE_TO_RANGE": (r"((-?)((\d+)(\.\d+)?)|(\.(\d+)))" + zh._RANGE_UNITS + "[~]" + r"((-?)((\d+)(\.\d+)?)|(\.(\d+)))"
                    + zh._RANGE_UNITS),
}
ZH_ALPHABET = (list("0123456789") * 3 + list(".-+×÷=/%~~~多余几个人年月元千克x²１２mc")
               + ["千克", "  ", "m2", "cm3", "m²", "km", "℃"])


def _groups_sub(pattern: re.Pattern, text: str) -> str:
    return pattern.sub(lambda m: "<" + "|".join(str(g) for g in m.groups()) + ">", text)


@pytest.mark.parametrize("name", sorted(UPSTREAM))
def test_rewritten_patterns_substitute_as_upstream(name):
    new, old = getattr(en, name), re.compile(UPSTREAM[name])
    rng = random.Random(name)
    for _ in range(20000):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 24)))
        assert _groups_sub(new, text) == _groups_sub(old, text), (name, text)


@pytest.mark.parametrize("name", sorted(ZH_UPSTREAM))
def test_rewritten_chinese_number_patterns_substitute_as_upstream(name):
    new, old = getattr(zh, name), re.compile(ZH_UPSTREAM[name])
    rng = random.Random(name)
    for _ in range(20000):
        text = "".join(rng.choice(ZH_ALPHABET) for _ in range(rng.randint(1, 24)))
        assert _groups_sub(new, text) == _groups_sub(old, text), (name, text)


HOSTILE = textwrap.dedent("""
    import re, sys, time
    from dora_primespeech_mlx.text import en_normalization as en
    from dora_primespeech_mlx.text.zh_normalization import numbers as zh
    n = int(sys.argv[1])
    units = ["9", "1.", "1,", "1 ", "1. ", "1:", "1-", " -", "1/", "1£", "(", "\\t", " ", "1km", "1 + ", "a + ", "9s",
             "１", "1.1", "1个"]
    worst = (0.0, "")
    for name, pattern in [*vars(en).items(), *vars(zh).items()]:
        if not isinstance(pattern, re.Pattern):
            continue
        for unit in units:
            for tail in ("", "x", "£", "$", "/", "st", ". ", "%", "+"):
                text = unit * (n // len(unit)) + tail
                t0 = time.perf_counter()
                pattern.sub("", text)
                pattern.search(text)
                worst = max(worst, (time.perf_counter() - t0, f"{name} on {unit!r} x {n // len(unit)} + {tail!r}"))
    print(f"{worst[0]:.3f} {worst[1]}")
""")


@pytest.mark.slow
def test_every_number_pattern_is_linear_on_long_runs():
    """20 000-character runs (four times MAX_TEXT_CHARS' default): each pattern finishes in well under a second
    (a quadratic one needs seconds, a cubic one hours)."""
    proc = subprocess.run([sys.executable, "-c", HOSTILE, "20000"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    seconds, what = proc.stdout.split(" ", 1)
    print(f"slowest pattern: {seconds} s ({what.strip()})")
    assert float(seconds) < 1.0, proc.stdout


def test_a_5000_digit_number_is_refused_at_once():
    """Issue 24's text: 4 999 nines as English blocked the node for more than 200 s; now the number rules run in
    milliseconds and the front end refuses the number (inflect reads at most 36 digits)."""
    code = ("import time; from dora_primespeech_mlx.text import en_normalization as en\n"
            "en._inflect()\n"  # its first import alone takes seconds on a loaded machine
            "t0 = time.perf_counter()\n"
            "for text in ('9' * 4999, '3. ' + '1' * 1600, '9' * 4999 + '£', '(' * 2500 + '1' * 2500 + '$'):\n"
            "    try:\n        en.normalize(text)\n    except Exception:\n        pass\n"
            "print(time.perf_counter() - t0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout) < 5.0
