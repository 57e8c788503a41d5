"""URLs, e-mail addresses and autolinks become words: the domain is read ("example dot com", "example 点 com"), the
path and query are dropped, an e-mail's "@" is read per language family."""

from __future__ import annotations

import re

from .phrases import CJK_END, HOLE

_AUTOLINK_RE = re.compile(r"<((?:https?|ftp)://[^\s<>]+|mailto:[^\s<>]+|[\w.+-]+@[\w-]+(?:\.[\w-]+)+)>")

_URL_STOP = "\\s<>()\\[\\]{}\"'，。！？、；：（）【】「」『』《》"
_URL_RE = re.compile(rf"(?<![A-Za-z0-9_@/.])(?:(?:https?|ftp)://|www\.)[^{_URL_STOP}]+")
_EMAIL_RE = re.compile(r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@([A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,})"
                       r"(?![A-Za-z0-9-]|\.[A-Za-z0-9])")

# reading of a domain's dots and of "@", per language family
_DOT = {"zh": " 点 ", "yue": " dot ", "ja": " ドット ", "ko": " 닷 ", "en": " dot "}
_AT = {"zh": " 艾特 ", "yue": " at ", "ja": " アット ", "ko": None, "en": " at "}


def _domain_words(host: str, family: str) -> str:
    """A host name (or an e-mail's user part) with its dots read: "example dot com"."""
    host = host.removeprefix("www.").removeprefix("WWW.").strip(".")
    return _DOT[family].join(part for part in host.split(".") if part)


def _url_words(url: str, family: str) -> tuple[str, str]:
    """(the domain as words, the trailing sentence punctuation the URL pattern swallowed)."""
    tail = ""
    while url and url[-1] in ".,;:!?":
        tail, url = url[-1] + tail, url[:-1]
    rest = re.sub(r"^(?:(?:https?|ftp)://)", "", url, flags=re.IGNORECASE)
    host = re.split(r"[/?#]", rest, maxsplit=1)[0].rsplit("@", 1)[-1].split(":", 1)[0]
    return _domain_words(host, family), tail


def _spaced(words: str, before: str, after: str) -> str:
    """``words`` with the spaces it needs between neighbours that are letters of a spaced script."""
    words = words.strip()
    lead = " " if before and before[-1].isalnum() and not CJK_END.match(before[-1]) else ""
    trail = " " if after and after[0].isalnum() and not CJK_END.match(after[0]) else ""
    return lead + words + trail


def replace_urls(line: str, family: str) -> str:
    def url(m: re.Match) -> str:
        words, tail = _url_words(m.group(0), family)
        return _spaced(words, m.string[: m.start()], m.string[m.end():]) + tail if words else HOLE + tail

    def email(m: re.Match) -> str:
        at = _AT[family]
        if at is None:
            return m.group(0)
        user = m.group(0).split("@", 1)[0]
        words = _domain_words(user, family) + at + _domain_words(m.group(1), family)
        return _spaced(words, m.string[: m.start()], m.string[m.end():])

    def autolink(m: re.Match) -> str:
        target = m.group(1)
        if target.lower().startswith("mailto:"):
            target = target[7:]
        if "@" in target and "://" not in target:
            return _EMAIL_RE.sub(email, target)
        return _url_words(target, family)[0]

    line = _AUTOLINK_RE.sub(autolink, line)
    line = _URL_RE.sub(url, line)
    return _EMAIL_RE.sub(email, line)
