"""Telephone numbers, read digit by digit with 1 as 幺 and a pause (，) between groups."""

from __future__ import annotations

import re

from .numbers import verbalize_digit

# Mainland mobile prefixes (13x, 15x without 154, 17[678], 18x, 19[89]), optional +86.
RE_MOBILE_PHONE = re.compile(r"(?<!\d)((\+?86 ?)?1([38]\d|5[0-35-9]|7[678]|9[89])\d{8})(?!\d)")
# Landlines: optional area code (010, 02x, 0xxx) then 7-8 digits.
RE_TELEPHONE = re.compile(r"(?<!\d)((0(10|2[1-3]|[3-9]\d{2})-?)?[1-9]\d{6,7})(?!\d)")
# Nationwide 400 numbers.
RE_NATIONAL_UNIFORM_NUMBER = re.compile(r"(400)(-)?\d{3}(-)?\d{4}")


def _read_groups(groups: list[str]) -> str:
    return "，".join(verbalize_digit(g, alt_one=True) for g in groups)


def replace_mobile(m: re.Match) -> str:
    return _read_groups(m.group(0).strip("+").split())


def replace_phone(m: re.Match) -> str:
    return _read_groups(m.group(0).split("-"))
