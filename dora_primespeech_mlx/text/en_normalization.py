"""English text normalisation, as GPT-SoVITS v2 does it (``text/en_normalization/expend.py``).

:func:`normalize` spells out numbers with ``inflect`` and reduces the text to ``[ A-Za-z'.,?!-]``.
The rules run in a fixed order and reproduce the original exactly, quirks included (:func:`normalize` gives
examples)."""

from __future__ import annotations

import functools
import re
import unicodedata

# unit -> (singular, plural)
_UNITS = {
    "m": ("meter", "meters"),
    "km": ("kilometer", "kilometers"),
    "km/h": ("kilometer per hour", "kilometers per hour"),
    "ft": ("feet", "feet"),
    "L": ("liter", "liters"),
    "tbsp": ("tablespoon", "tablespoons"),
    "tsp": ("teaspoon", "teaspoons"),
    "h": ("hour", "hours"),
    "min": ("minute", "minutes"),
    "s": ("second", "seconds"),
    "°C": ("degree celsius", "degrees celsius"),
    "°F": ("degree fahrenheit", "degrees fahrenheit"),
}

_LIST_ORDINAL = re.compile(r"\b([0-9]+)\. ")
_COMMA_NUMBER = re.compile(r"([0-9][0-9,]+[0-9])")
_TIME = re.compile(r"\b([01]?[0-9]|2[0-3]):([0-5][0-9])\b")
# The alternatives are tried in this order, so "km" matches before "km/h" can.
_MEASUREMENT = re.compile(r"\b([0-9]+(\.[0-9]+)?(m|km|km/h|ft|L|tbsp|tsp|h|min|s|°C|°F))\b")
_POUNDS_BEFORE = re.compile(r"£([0-9.,]*[0-9])")
_POUNDS_AFTER = re.compile(r"(?<![0-9.,])([0-9.,]*[0-9])£")
_DOLLARS_BEFORE = re.compile(r"\$([0-9.,]*[0-9])")
_DOLLARS_AFTER = re.compile(r"(?<![(0-9.,])([(0-9.,]*[0-9])\$")  # "(" really is in the class upstream
_DECIMAL = re.compile(r"(?<![0-9])([0-9]+\.\s*[0-9]+)")
_FRACTION = re.compile(r"(?<![0-9])([0-9]+/[0-9]+)")
_ORDINAL = re.compile(r"(?<![0-9])[0-9]+(st|nd|rd|th)")
_NUMBER = re.compile(r"[0-9]+")

# An operand: optional minus, number with optional decimals, or a decimal without integer part, or a
# single letter; each may carry superscripts. Operator with whitespace on both sides.
_OPERAND = r"((-?)(?<!\d)((\d+)(\.\d+)?[⁰¹²³⁴⁵⁶⁷⁸⁹ˣʸⁿ]*)|(\.\d+[⁰¹²³⁴⁵⁶⁷⁸⁹ˣʸⁿ]*)|([A-Za-z][⁰¹²³⁴⁵⁶⁷⁸⁹ˣʸⁿ]*))"
_ARITHMETIC = re.compile(_OPERAND + r"\s+([-+×÷=])\s+" + _OPERAND)
_OPERATORS = {"+": " plus ", "-": " minus ", "×": " times ", "÷": " divided by ", "=": " Equals "}
# A minus at the start or after whitespace; the whitespace is consumed and not put back.
_NEGATIVE = re.compile(r"(?:^|(?<!\s)\s+)(-)(\d+)")

_NOT_KEPT = re.compile(r"[^ A-Za-z'.,?!\-]")
_IE = re.compile(r"(?i)i\.e\.")
_EG = re.compile(r"(?i)e\.g\.")
_INNER_CAPITAL = re.compile(r"(?<!^)(?<![\s])([A-Z])")


@functools.lru_cache(maxsize=1)
def _inflect():
    return import_inflect().engine()


def import_inflect():
    """``inflect``, imported without typeguard's run-time instrumentation of its methods. inflect 7 decorates its
    ``engine`` class with ``typeguard.typechecked``, which re-parses and recompiles the class's source at import:
    most of the English front end's load (``tests/text/test_english.py -k cold``). That decorator is a no-op under
    ``python -O`` by typeguard's design; here it is one for this import only. The checks only raise on arguments of
    the wrong type, which this front end never passes (its calls and their words are unchanged)."""
    import sys

    if "inflect" in sys.modules:
        return sys.modules["inflect"]
    import typeguard

    checked = typeguard.typechecked

    def unchecked(target=None, **_options):
        return target if target is not None else (lambda late: late)

    typeguard.typechecked = unchecked
    try:
        import inflect
    finally:
        typeguard.typechecked = checked
    return inflect


def _list_ordinal(m: re.Match) -> str:
    return _inflect().ordinal(m.group(1)) + ", "


def _time(m: re.Match) -> str:
    hours, minutes = int(m.group(1)), int(m.group(2))
    period = "a.m." if hours < 12 else "p.m."
    if hours > 12:
        hours -= 12
    hour = _inflect().number_to_words(hours)
    if minutes == 0:
        return f"{hour} o'clock {period}"
    return f"{hour} {_inflect().number_to_words(minutes)} {period}"


def _measurement(m: re.Match) -> str:
    text, decimals, unit = m.group(1), m.group(2), m.group(3)
    # Upstream drops the dot to get "a number": only an integer 1 is singular.
    value = int(text.replace(unit, "").replace(".", ""))
    singular, plural = _UNITS[unit]
    name = singular if decimals is None and value == 1 else plural
    return text.replace(unit, " " + name)


def _money(amount: str, units: tuple[str, str, str, str], zero: str) -> str:
    """``amount`` like "12.50" -> "12 dollars and 50 cents" (the digits are spelled out later)."""
    big_one, big_many, small_one, small_many = units
    parts = amount.split(".")
    if len(parts) > 2:
        return amount + " " + big_many
    big = int(parts[0]) if parts[0] else 0
    small = int(parts[1].ljust(2, "0")) if len(parts) > 1 and parts[1] else 0
    big_words = f"{big} {big_one if big == 1 else big_many}"
    small_words = f"{small} {small_one if small == 1 else small_many}"
    if big and small:
        return f"{big_words} and {small_words}"
    if big:
        return big_words
    if small:
        return small_words
    return zero


def _pounds(m: re.Match) -> str:
    return _money(m.group(1), ("pound", "pounds", "penny", "pence"), "zero pounds")


def _dollars(m: re.Match) -> str:
    return _money(m.group(1), ("dollar", "dollars", "cent", "cents"), "zero dollars")


def _decimal(m: re.Match) -> str:
    whole, fraction = m.group(1).split(".")[:2]
    # Every character after the dot is read on its own (whitespace allowed by the pattern included).
    return whole + " point " + " ".join(fraction)


def _fraction(m: re.Match) -> str:
    numerator, denominator = (int(x) for x in m.group(0).split("/"))
    top = _inflect().number_to_words(numerator)
    if denominator == 2:
        bottom = "half" if numerator == 1 else "halves"
    elif denominator == 1:
        return top
    else:
        bottom = _inflect().ordinal(_inflect().number_to_words(denominator))
        if numerator > 1:
            bottom += "s"
    return f"{top} {bottom}"


def _ordinal(m: re.Match) -> str:
    return _inflect().number_to_words(m.group(0))


def _number(m: re.Match) -> str:
    num = int(m.group(0))
    if 1000 < num < 3000:
        if num == 2000:
            return "two thousand"
        if 2000 < num < 2010:
            return "two thousand " + _inflect().number_to_words(num % 100)
        if num % 100 == 0:
            return _inflect().number_to_words(num // 100) + " hundred"
        # Read as pairs: 1987 -> nineteen eighty-seven, 2010 -> twenty ten, 1905 -> nineteen oh five.
        return _inflect().number_to_words(num, andword="", zero="oh", group=2).replace(", ", " ")
    return _inflect().number_to_words(num, andword="")


def _arithmetic(m: re.Match) -> str:
    return m.group(1) + _OPERATORS[m.group(8)] + m.group(9)


def _negative(m: re.Match) -> str:
    return "negative " + m.group(2)


def _strip_accents(text: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")


def normalize(text: str) -> str:
    """Spell out numbers, symbols and abbreviations; keep only ``[ A-Za-z'.,?!-]``. Examples, quirks included:

    * ``"1. "`` -> ``"first, "`` (a number, a dot and a space is a list ordinal);
    * ``"3 + 4 = 7"`` -> ``"three plus four Equals seven"`` (operators need spaces around them);
    * ``" -5"`` -> ``"negative five"``, and the whitespace before the ``-`` is swallowed
      (``"to -5°C"`` -> ``"tonegative five degrees celsius"``);
    * ``"1,200"`` -> ``"twelve hundred"``, ``"1987"`` -> ``"nineteen eighty-seven"``,
      ``"2005"`` -> ``"two thousand five"``, ``"2010"`` -> ``"twenty ten"``;
    * ``"10:30"`` -> ``"ten thirty a.m."``, ``"13:45"`` -> ``"one forty-five p.m."``;
    * ``"60km/h"`` -> ``"sixty kilometersh"`` (``km`` wins over ``km/h``), ``"90s"`` -> ``"ninety seconds"``;
    * ``"$12.50"`` -> ``"twelve dollars and fifty cents"``, ``"£7.99"`` -> ``"seven pounds and ninety-nine pence"``;
    * ``"3.5"`` -> ``"three point five"``, ``"3/4"`` -> ``"three fourths"``, ``"3rd"`` -> ``"third"``;
    * accents are stripped (NFD), ``%`` -> ``" percent"``, ``i.e.``/``e.g.`` -> ``that is``/``for example``;
    * every capital not at the start of a word is split off: ``ChatGPT`` -> ``Chat G P T``,
      ``NASA`` -> ``N A S A``, ``iPhone`` -> ``i Phone``."""
    text = _LIST_ORDINAL.sub(_list_ordinal, text)
    while _ARITHMETIC.search(text):
        text = _ARITHMETIC.sub(_arithmetic, text)
    text = _NEGATIVE.sub(_negative, text)

    text = _COMMA_NUMBER.sub(lambda m: m.group(1).replace(",", ""), text)
    text = _TIME.sub(_time, text)
    text = _MEASUREMENT.sub(_measurement, text)
    text = _POUNDS_BEFORE.sub(_pounds, text)
    text = _POUNDS_AFTER.sub(_pounds, text)
    text = _DOLLARS_BEFORE.sub(_dollars, text)
    text = _DOLLARS_AFTER.sub(_dollars, text)
    text = _DECIMAL.sub(_decimal, text)
    text = _FRACTION.sub(_fraction, text)
    text = _ORDINAL.sub(_ordinal, text)
    text = _NUMBER.sub(_number, text)

    text = _strip_accents(text)
    text = text.replace("%", " percent")
    text = _NOT_KEPT.sub("", text)
    text = _IE.sub("that is", text)
    text = _EG.sub("for example", text)
    return _INNER_CAPITAL.sub(r" \1", text)
