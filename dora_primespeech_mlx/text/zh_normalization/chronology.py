"""Dates and clock times: 2024年3月15日, 2025-01-08, 9:30, 8:00-22:00."""

from __future__ import annotations

import re

from .numbers import DIGITS, num2str, verbalize_cardinal, verbalize_digit


def _time_part(value: str) -> str:
    """Minutes/seconds: a leading zero is read (05 -> 零五)."""
    text = num2str(value.lstrip("0"))
    return DIGITS["0"] + text if value.startswith("0") else text


_CLOCK = r"([0-1]?[0-9]|2[0-3]):([0-5][0-9])(:([0-5][0-9]))?"
RE_TIME = re.compile(_CLOCK)
RE_TIME_RANGE = re.compile(_CLOCK + r"(~|-)" + _CLOCK)


def _clock(hour: str, minute: str, second: str | None, half: bool) -> str:
    text = f"{num2str(hour)}点"
    if minute.lstrip("0"):
        text += "半" if half else f"{_time_part(minute)}分"
    if second and second.lstrip("0"):
        text += f"{_time_part(second)}秒"
    return text


def replace_time(m: re.Match) -> str:
    """A time, or a time range (the 9-group pattern)."""
    hour, minute, second = m.group(1), m.group(2), m.group(4)
    # The reference decides "半" for the second time of a range from the FIRST minute value.
    half = int(minute) == 30
    text = _clock(hour, minute, second, half)
    if len(m.groups()) > 5:
        text += "至" + _clock(m.group(6), m.group(7), m.group(9), half)
    return text


RE_DATE = re.compile(r"(\d{4}|\d{2})年((0?[1-9]|1[0-2])月)?(((0?[1-9])|((1|2)[0-9])|30|31)([日号]))?")


def replace_date(m: re.Match) -> str:
    year, month, day = m.group(1), m.group(3), m.group(5)
    text = f"{verbalize_digit(year)}年" if year else ""
    if month:
        text += f"{verbalize_cardinal(month)}月"
    if day:
        text += f"{verbalize_cardinal(day)}{m.group(9)}"
    return text


# YYYY-MM-DD, YYYY/MM/DD, YYYY.MM.DD, YYYY MM DD
RE_DATE2 = re.compile(r"(\d{4})([- /.])(0[1-9]|1[012])\2(0[1-9]|[12][0-9]|3[01])")


def replace_date2(m: re.Match) -> str:
    return f"{verbalize_digit(m.group(1))}年{verbalize_cardinal(m.group(3))}月{verbalize_cardinal(m.group(4))}日"
