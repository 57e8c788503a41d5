"""The text front end pipeline: text -> language segments -> phones and ids (docs/model.md, "Text front end").

* :func:`clean_text` — upstream ``text/cleaner.py:clean_text`` for one segment (zh, en, ja, ko, yue).
* :func:`get_phones` — upstream ``TextPreprocessor.get_phones_and_bert`` without the BERT step: the
  engine computes BERT features for every Chinese :class:`Segment` from its ``norm_text`` and
  ``word2ph`` (zeros for other segments).
* :func:`preprocess` — upstream ``TextPreprocessor.preprocess``: cut the target text into chunks
  and phonemise each.
* :func:`prompt_phones` — the reference-text path of ``TTS.run``.
* :func:`phones_json` — everything above as a JSON-ready dict (``primespeech-mlx phones``).

Every phonemising function takes ``data`` (:class:`~.options.TextData`: the dictionaries, NLTK data and the g2pW
choice). Every failure is a :class:`~.errors.TextFrontendError` (unknown language options:
:class:`~.errors.UnsupportedLanguageError`; a ja, ko or yue front end whose pip extra is not installed:
:class:`~.errors.MissingExtraError`). Those three load their libraries on first use."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from .budget import checkpoint, stops
from .errors import TextFrontendError, UnsupportedLanguageError
from .language_segments import LANGUAGES, check_option, split_languages
from .llm import clean
from .options import TextData
from .segmentation import MAX_CHUNK_CHARS, split_text, splits
from .symbols import cleaned_text_to_sequence, symbols, table_version

#: Fewer phones than this for a whole text: upstream phonemises "." + text once more.
MIN_PHONES = 6
#: Fewer English phones than this in a segment: upstream puts "," in front.
MIN_EN_PHONES = 4
#: Languages whose ``g2p`` takes the front end's data (dictionaries, NLTK data, g2pW).
_G2P_TAKES_DATA = frozenset({"zh", "en", "ko"})
#: Special marks in Chinese text: the mark becomes "," and every "," phone of the segment this symbol.
SPECIAL_MARKS = (("￥", "SP2"), ("^", "SP3"))

_SPACES_RE = re.compile(r" {2,}")
_SURROGATES_RE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class Segment:
    """One language segment of a text and its phonemes (one upstream ``clean_text_inf`` call).

    ``word2ph`` (Chinese only, else None) has one entry per character of ``norm_text``: how many of
    ``phones`` belong to it; BERT features of ``norm_text`` are repeated with it.
    """

    lang: str
    text: str
    norm_text: str
    phones: tuple[str, ...]
    phone_ids: tuple[int, ...]
    word2ph: tuple[int, ...] | None


@dataclass(frozen=True)
class PhoneResult:
    """Phonemes of a whole text (upstream ``get_phones_and_bert`` minus BERT).

    ``text`` is the input; when it gave fewer than 6 phones the result is that of ``"." + text``
    (``retried_with_dot``), and ``segments`` describe that pass. ``word2ph`` is the concatenation of
    the segments' ``word2ph`` when every segment is Chinese, else None.
    """

    text: str
    phone_ids: tuple[int, ...]
    phones: tuple[str, ...]
    word2ph: tuple[int, ...] | None
    norm_text: str
    segments: tuple[Segment, ...]
    retried_with_dot: bool = False


@dataclass(frozen=True)
class Chunk:
    """A chunk of a target text as cut by :func:`preprocess`, with its phonemes."""

    text: str
    result: PhoneResult

    @property
    def norm_text(self) -> str:
        return self.result.norm_text

    @property
    def phone_ids(self) -> tuple[int, ...]:
        return self.result.phone_ids

    @property
    def phones(self) -> tuple[str, ...]:
        return self.result.phones

    @property
    def segments(self) -> tuple[Segment, ...]:
        return self.result.segments


def sanitize(text: object) -> str:
    """Check the type and remove lone surrogates (they cannot be encoded and break the libraries)."""
    if not isinstance(text, str):
        raise TextFrontendError(f"text must be a str, not {type(text).__name__}")
    return _SURROGATES_RE.sub("", text)


def _language_module(lang: str):
    if lang == "zh":
        from . import chinese

        return chinese
    if lang == "ja":
        from . import japanese

        return japanese
    if lang == "ko":
        from . import korean

        return korean
    if lang == "yue":
        from . import cantonese

        return cantonese
    from . import english

    return english


def _g2p(lang: str, module, data: TextData):
    """``module.g2p`` of ``lang``, given ``data`` where it takes it."""
    return functools.partial(module.g2p, data=data) if lang in _G2P_TAKES_DATA else module.g2p


def _call(lang: str, what: str, fn, arg):
    try:
        return fn(arg)
    except TextFrontendError:
        raise
    except Exception as exc:
        if stops(exc):  # a checkpoint's check: cancelled, or out of time
            raise
        raise TextFrontendError(f"{lang} {what} failed on {arg[:60]!r}: {type(exc).__name__}: {exc}") from exc


def _clean_special(text: str, mark: str, target: str, table: frozenset,
                   data: TextData) -> tuple[list[str], list[int], str]:
    chinese = _language_module("zh")
    norm_text = _call("zh", "text_normalize", chinese.text_normalize, text.replace(mark, ","))
    phones, word2ph = _call("zh", "g2p", _g2p("zh", chinese, data), norm_text)
    for ph in phones:
        if ph not in table:
            raise TextFrontendError(f"zh g2p produced {ph!r}, which is not a v2 symbol (in {norm_text!r})")
    return [target if ph == "," else ph for ph in phones], list(word2ph), norm_text


def clean_text(text: str, lang: str, version: str = "v2", *,
               data: TextData) -> tuple[list[str], list[int] | None, str]:
    """Phones, word2ph (zh only, else None) and normalised text of one segment (``cleaner.clean_text``).

    ``lang`` is "zh", "en", "ja", "ko" or "yue" (word2ph for zh and yue); any other label that upstream's
    language splitter can produce (e.g. "punctuation" for a text of marks only in ``auto`` mode) is
    treated like upstream: English with the text " ".
    """
    if table_version(version) == "v1":
        raise TextFrontendError("the v1 text front end (text/chinese.py) is not implemented; use a v2+ model")
    if lang not in LANGUAGES:
        lang, text = "en", " "
    table = frozenset(symbols(version))
    if lang == "zh":
        for mark, target in SPECIAL_MARKS:
            if mark in text:
                return _clean_special(text, mark, target, table, data)
    module = _language_module(lang)
    norm_text = _call(lang, "text_normalize", module.text_normalize, text)
    word2ph: list[int] | None
    if lang in ("zh", "yue"):
        phones, word2ph = _call(lang, "g2p", _g2p(lang, module, data), norm_text)
        phones, word2ph = list(phones), list(word2ph)
        if len(phones) != sum(word2ph) or len(norm_text) != len(word2ph):
            raise TextFrontendError(
                f"{lang} g2p gave {len(phones)} phones / word2ph {word2ph} for {norm_text!r} (inconsistent)"
            )
    else:
        phones = list(_call(lang, "g2p", _g2p(lang, module, data), norm_text))
        if lang == "en" and len(phones) < MIN_EN_PHONES:
            phones = [",", *phones]
        word2ph = None
    return [ph if ph in table else "UNK" for ph in phones], word2ph, norm_text


def _segment(lang: str, text: str, version: str, data: TextData) -> Segment:
    checkpoint()
    phones, word2ph, norm_text = clean_text(text, lang, version, data=data)
    return Segment(
        lang=lang,
        text=text,
        norm_text=norm_text,
        phones=tuple(phones),
        phone_ids=tuple(cleaned_text_to_sequence(phones, version)),
        word2ph=None if word2ph is None else tuple(word2ph),
    )


def get_phones(text: str, language: str, version: str = "v2", *, data: TextData) -> PhoneResult:
    """Phonemes of ``text`` for a language option (:data:`~.language_segments.SUPPORTED_OPTIONS`).

    Upstream ``get_phones_and_bert``: runs of spaces collapse to one, the text is split by language,
    every segment is cleaned, and a result with fewer than 6 phones is recomputed once on ``"." + text``.
    """
    text = sanitize(text)
    check_option(language)
    return _get_phones(text, language, version, data, retry=True)


def _get_phones(original: str, language: str, version: str, data: TextData, retry: bool) -> PhoneResult:
    text = _SPACES_RE.sub(" ", original)
    segments = tuple(_segment(lang, part, version, data) for lang, part in split_languages(text, language))
    phones = tuple(ph for s in segments for ph in s.phones)
    if retry and len(phones) < MIN_PHONES:
        result = _get_phones("." + text, language, version, data, retry=False)
        return PhoneResult(
            text=original,
            phone_ids=result.phone_ids,
            phones=result.phones,
            word2ph=result.word2ph,
            norm_text=result.norm_text,
            segments=result.segments,
            retried_with_dot=True,
        )
    all_zh = bool(segments) and all(s.lang == "zh" for s in segments)
    return PhoneResult(
        text=original,
        phone_ids=tuple(i for s in segments for i in s.phone_ids),
        phones=phones,
        word2ph=tuple(n for s in segments for n in s.word2ph) if all_zh else None,
        norm_text="".join(s.norm_text for s in segments),
        segments=segments,
    )


def preprocess(text: str, language: str, method: str = "cut5", version: str = "v2", *,
               data: TextData) -> list[Chunk]:
    """The target-text path (upstream ``TextPreprocessor.preprocess``): cut ``text`` with ``method``
    (:func:`~.segmentation.split_text`), phonemise every chunk, drop chunks whose normalised text is
    empty. A text with nothing to speak gives ``[]`` (or raises, where upstream's ``filter_text``
    does). A run of more than ``MAX_CHUNK_CHARS`` characters without a split mark is refused in every
    language (upstream reads it as one chunk, or fails on the empty chunk before it)."""
    text = sanitize(text)
    check_option(language)
    chunks = []
    for part in split_text(text, method, language):
        checkpoint()
        if (not part and language != "en") or len(part) > MAX_CHUNK_CHARS:
            raise TextFrontendError(
                f"the text has a run of more than {MAX_CHUNK_CHARS} characters without a split mark "
                "(，。？！,.?!~:：—…), which the front end does not read: add punctuation"
            )
        result = _get_phones(part, language, version, data, retry=True)
        if result.norm_text:
            chunks.append(Chunk(text=part, result=result))
    return chunks


def prompt_text_input(prompt_text: str | None, language: str) -> str | None:
    """What ``TTS.run`` phonemises for a reference text: ``strip("\\n")`` and an end mark ("。", or "."
    for en) when the last character is not a split mark. None when there is no prompt text."""
    if prompt_text is None:
        return None
    text = sanitize(prompt_text).strip("\n")
    if not text:
        return None
    if text[-1] not in splits:
        text += "." if language == "en" else "。"
    return text


def prompt_phones(prompt_text: str | None, language: str, version: str = "v2", *,
                  data: TextData) -> PhoneResult | None:
    """Phonemes of a reference ("prompt") text, or None when it is empty (reference-free synthesis)."""
    check_option(language)
    text = prompt_text_input(prompt_text, language)
    if text is None:
        return None
    return _get_phones(text, language, version, data, retry=True)


def _segment_json(s: Segment) -> dict:
    return {
        "lang": s.lang,
        "text": s.text,
        "norm_text": s.norm_text,
        "phones": list(s.phones),
        "phone_ids": list(s.phone_ids),
        "word2ph": None if s.word2ph is None else list(s.word2ph),
    }


def _result_json(r: PhoneResult) -> dict:
    return {
        "norm_text": r.norm_text,
        "phones": list(r.phones),
        "phone_ids": list(r.phone_ids),
        "word2ph": None if r.word2ph is None else list(r.word2ph),
        "retried_with_dot": r.retried_with_dot,
        "segments": [_segment_json(s) for s in r.segments],
    }


def phones_json(text: str, language: str, version: str = "v2", method: str | None = None, llm: bool = False, *,
                data: TextData) -> dict:
    """A JSON-ready description of how ``text`` is phonemised (the layout of the text fixtures).

    With ``method`` (e.g. "cut5") the target-text chunks of :func:`preprocess` are included. With ``llm`` the text
    first passes the LLM text stage (:func:`~.llm.clean`); ``spoken_text`` is what it leaves, ``norm_text`` its
    normalised form."""
    out = {"text": text, "language": language, "version": version}
    if llm:
        text = clean(sanitize(text), language)
        out["spoken_text"] = text
        if not text.strip():
            raise TextFrontendError("nothing to speak: the LLM text stage leaves nothing of this text (reasoning, "
                                    "tool calls, code or markup only)")
    out.update(_result_json(get_phones(text, language, version, data=data)))
    if method is not None:
        chunks = preprocess(text, language, method, version, data=data)
        out["preprocess"] = {
            "method": method,
            "chunks": [{"input": c.text, **_result_json(c.result)} for c in chunks],
        }
    return out


__all__ = [
    "Chunk",
    "PhoneResult",
    "Segment",
    "TextData",
    "TextFrontendError",
    "UnsupportedLanguageError",
    "clean_text",
    "get_phones",
    "phones_json",
    "preprocess",
    "prompt_phones",
    "prompt_text_input",
    "sanitize",
]
