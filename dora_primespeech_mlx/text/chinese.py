"""Chinese front end of GPT-SoVITS v2 (``text/chinese2.py``): text -> normalised text -> phones.

* :func:`text_normalize` writes numbers, dates, units and symbols out in characters
  (:mod:`.zh_normalization`), maps Chinese punctuation to ``! ? … , . -``, deletes every other
  non-CJK character and collapses runs of punctuation.
* :func:`g2p` turns that text into phones of the v2 symbol table: two per character (initial, final
  with tone 1-5) and one per punctuation mark, with ``word2ph`` counting them per character.

Pinyin comes from pypinyin (``lazy_pinyin`` on each jieba word), then tone sandhi (:mod:`.tone_sandhi`) and
erhua; this is upstream's ``is_g2pw = False`` branch, which the reference fixtures use. With g2pW switched on
(``TextData.g2pw``) and a g2pW model installed, polyphonic characters are predicted by g2pW (:mod:`.g2pw`).
Upstream's ``cleaner.clean_text`` handling of ``￥`` and ``^`` (``,`` then ``SP2``/``SP3`` phones) belongs to
the pipeline, which composes these two functions."""

from __future__ import annotations

import logging
import re
import threading
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from pypinyin import Style, lazy_pinyin

from .budget import checkpoint
from .errors import TextFrontendError
from .g2pw import load_predictor
from .options import G2PWOptions, TextData
from .pinyin_map import pinyin_to_phones
from .tone_sandhi import ToneSandhi
from .zh_normalization import normalize

if TYPE_CHECKING:
    from .g2pw import G2PWPredictor

logger = logging.getLogger(__name__)

PUNCTUATION = ("!", "?", "…", ",", ".", "-")

# ------------------------------------------------------------------------------------ normalisation

_PUNCT_MAP = {
    "：": ",",
    "；": ",",
    "，": ",",
    "。": ".",
    "！": "!",
    "？": "?",
    "\n": ".",
    "·": ",",
    "、": ",",
    "...": "…",
    "$": ".",
    "/": ",",
    "—": "-",
    "~": "…",
    "～": "…",
}
_PUNCT_MAP_RE = re.compile("|".join(re.escape(key) for key in _PUNCT_MAP))
_PUNCT_CLASS = re.escape("".join(PUNCTUATION))
_NOT_KEPT_RE = re.compile(rf"[^\u4e00-\u9fa5{_PUNCT_CLASS}]+")
_REPEATED_PUNCT_RE = re.compile(rf"([{_PUNCT_CLASS}])([{_PUNCT_CLASS}])+")


def replace_punctuation(text: str) -> str:
    """Map Chinese punctuation to the six v2 marks and delete everything that is not a CJK
    ideograph (U+4E00-U+9FA5) or one of those marks."""
    text = text.replace("嗯", "恩").replace("呣", "母")
    text = _PUNCT_MAP_RE.sub(lambda m: _PUNCT_MAP[m.group()], text)
    return _NOT_KEPT_RE.sub("", text)


def replace_consecutive_punctuation(text: str) -> str:
    """A run of punctuation marks keeps its first mark (``?!`` -> ``?``)."""
    return _REPEATED_PUNCT_RE.sub(r"\1", text)


def _ascii_digits(text: str) -> str:
    """Non-ASCII decimal digits (Arabic-Indic, Devanagari, ...) -> ASCII. Upstream's number rules match
    them through ``\\d`` but its tables only know 0-9, so it crashes on them; we read them as numbers."""
    if text.isascii():
        return text
    return "".join(str(unicodedata.digit(ch)) if ch.isdecimal() and not ch.isascii() else ch for ch in text)


def text_normalize(text: str) -> str:
    """Normalised Chinese text: only CJK ideographs and ``! ? … , . -`` remain."""
    text = _ascii_digits(text)
    return replace_consecutive_punctuation("".join(replace_punctuation(s) for s in normalize(text)))


# ------------------------------------------------------------------------------------ g2p

_SENTENCE_SPLIT_RE = re.compile(rf"(?<=[{_PUNCT_CLASS}])\s*")
_LATIN_RE = re.compile("[a-zA-Z]+")

# Erhua exceptions: 儿 keeps its own tone in NOT_ERHUA words (and for POS a, j, nr) ...
NOT_ERHUA = frozenset(
    "虐儿 为儿 护儿 瞒儿 救儿 替儿 有儿 一儿 我儿 俺儿 妻儿 拐儿 聋儿 乞儿 患儿 幼儿 孤儿 婴儿 婴幼儿 连体儿 脑瘫儿 "
    "流浪儿 体弱儿 混血儿 蜜雪儿 舫儿 祖儿 美儿 应采儿 可儿 侄儿 孙儿 侄孙儿 女儿 男儿 红孩儿 花儿 虫儿 马儿 鸟儿 猪儿 "
    "猫儿 狗儿 少儿".split()
)
# ... unless the word is one of these.
MUST_ERHUA = frozenset("小院儿 胡同儿 范儿 老汉儿 撒欢儿 寻老礼儿 妥妥儿 媳妇儿".split())

# Spelling fixes from pypinyin's initial/final split back to a whole pinyin syllable.
_FINAL_SPELLING = {"uei": "ui", "iou": "iu", "uen": "un"}  # after an initial
_ZERO_INITIAL_SYLLABLE = {"ing": "ying", "i": "yi", "in": "yin", "u": "wu"}
_ZERO_INITIAL_LETTER = {"v": "yu", "e": "e", "i": "y", "u": "w"}


@dataclass(frozen=True)
class _Runtime:
    """What g2p needs from the (slow to load) libraries."""

    posseg_cut: Callable[[str], list]
    sandhi: ToneSandhi
    pinyin_predictor: G2PWPredictor | None  # set when g2pW is switched on and usable


_runtimes: dict[G2PWOptions, _Runtime] = {}  # by g2pW choice (jieba itself is loaded once per process)
_runtime_lock = threading.Lock()


def _quiet_jieba(jieba_fast) -> None:
    """jieba_fast logs its dictionary loading to stderr at DEBUG; send it through ``logging``."""
    jieba_logger = logging.getLogger("jieba_fast")
    for handler in list(jieba_logger.handlers):
        if handler is getattr(jieba_fast, "log_console", None):
            jieba_logger.removeHandler(handler)
    jieba_logger.setLevel(logging.INFO)


_WORD_TAGS_FORMAT = 1  # bump when the prepared form of jieba's part-of-speech table changes


def _posseg(cache: Path | None):
    """``jieba_fast.posseg``, its part-of-speech table (word -> tag, ~350 000 entries of jieba's dictionary, which
    the module parses at import) read from a prepared copy in ``cache`` when there (``jieba-word-tags-<hash>``, the
    hash: of the dictionary's bytes and the format), else parsed as jieba does and written there for the next start
    (a failure to write only logs; a damaged or foreign copy is parsed again, with a DEBUG line)."""
    import sys

    import jieba_fast

    if cache is None or "jieba_fast.posseg" in sys.modules:
        import jieba_fast.posseg as posseg

        return posseg
    import hashlib
    import io
    import marshal
    import os

    with jieba_fast.dt.get_dict_file() as f:
        raw = f.read()
    digest = hashlib.sha256(f"{_WORD_TAGS_FORMAT}".encode() + raw).hexdigest()[:24]
    target = Path(cache) / f"jieba-word-tags-{digest}.marshal"
    tags = None
    try:
        tags = marshal.loads(target.read_bytes())
        if not (isinstance(tags, dict) and tags):
            raise ValueError("not a word table")
    except FileNotFoundError:
        tags = None
    except (OSError, ValueError, EOFError, TypeError) as exc:
        logger.debug("prepared part-of-speech table %s ignored (%s); parsing jieba's dictionary", target, exc)
        tags = None
    if tags is None:
        import jieba_fast.posseg as posseg

        try:
            Path(cache).mkdir(parents=True, exist_ok=True)
            partial = target.with_suffix(f".{os.getpid()}.part")
            partial.write_bytes(marshal.dumps(posseg.dt.word_tag_tab))
            os.replace(partial, target)
        except OSError as exc:
            logger.info("the prepared part-of-speech table was not written to %s: %s", cache, exc)
        return posseg
    jieba_fast.dt.get_dict_file = lambda: io.BytesIO(b"")  # the import's own parse reads nothing ...
    try:
        import jieba_fast.posseg as posseg
    finally:
        del jieba_fast.dt.get_dict_file  # (the class's method again)
    posseg.dt.word_tag_tab = tags  # ... and gets the prepared table
    return posseg


def runtime(options: G2PWOptions, cache: Path | None = None) -> _Runtime:
    """jieba (dictionary loaded), the tone sandhi rules and the g2pW predictor ``options`` ask for (None:
    pypinyin); built once per g2pW choice, thread-safe. ``cache``: the folder of the prepared part-of-speech
    table (:func:`_posseg`; None: parsed)."""
    rt = _runtimes.get(options)
    if rt is None:
        with _runtime_lock:
            rt = _runtimes.get(options)
            if rt is None:
                import jieba_fast

                posseg = _posseg(cache)
                _quiet_jieba(jieba_fast)
                jieba_fast.initialize()
                rt = _runtimes[options] = _Runtime(
                    posseg_cut=posseg.lcut,
                    sandhi=ToneSandhi(jieba_fast.cut_for_search),
                    pinyin_predictor=load_predictor(options),
                )
    return rt


@lru_cache(maxsize=8192)
def _pinyin(word: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """pypinyin initials and finals (tone digit, 5 = neutral) of a word; cached."""
    initials = lazy_pinyin(word, neutral_tone_with_five=True, style=Style.INITIALS)
    finals = lazy_pinyin(word, neutral_tone_with_five=True, style=Style.FINALS_TONE3)
    return tuple(initials), tuple(finals)


def _merge_erhua(finals: list[str], word: str, pos: str) -> list[str]:
    """儿 stays its own syllable; a word-final 儿 takes the tone of the syllable before it."""
    finals = list(finals)
    if finals and len(word) >= len(finals) and word[len(finals) - 1] == "儿" and finals[-1] == "er1":
        finals[-1] = "er2"
    if word not in MUST_ERHUA and (word in NOT_ERHUA or pos in {"a", "j", "nr"}):
        return finals
    if len(finals) != len(word):
        return finals
    if len(finals) >= 2 and word[-1] == "儿" and finals[-1] in {"er2", "er5"} and word[-2:] not in NOT_ERHUA:
        finals[-1] = "er" + finals[-2][-1]
    return finals


def _syllable_phones(initial: str, final: str, sentence: str) -> list[str]:
    """The two phones of one syllable (pypinyin initial + final with tone)."""
    bare, tone = final[:-1], final[-1:]
    if tone not in {"1", "2", "3", "4", "5"}:
        raise TextFrontendError(f"no tone in the pinyin {initial + final!r} of {sentence!r}")
    if initial:
        pinyin = initial + _FINAL_SPELLING.get(bare, bare)
    elif bare in _ZERO_INITIAL_SYLLABLE:
        pinyin = _ZERO_INITIAL_SYLLABLE[bare]
    elif bare[:1] in _ZERO_INITIAL_LETTER:
        pinyin = _ZERO_INITIAL_LETTER[bare[0]] + bare[1:]
    else:
        pinyin = bare
    phones = pinyin_to_phones().get(pinyin)
    if phones is None:
        raise TextFrontendError(f"pinyin {pinyin!r} (from {initial + final!r}) of {sentence!r} has no phones")
    return [phones[0], phones[1] + tone]


def _sentence_syllables(sentence: str, rt: _Runtime) -> tuple[list[str], list[str]]:
    """Initials and finals (after sandhi and erhua) of one punctuation-delimited sentence."""
    words = rt.sandhi.pre_merge_for_modify(rt.posseg_cut(sentence))
    predicted = rt.pinyin_predictor.predict(sentence) if rt.pinyin_predictor is not None else None
    initials: list[str] = []
    finals: list[str] = []
    start = 0
    for word, pos in words:
        checkpoint()
        end = start + len(word)
        if pos == "eng":
            start = end
            continue
        if predicted is None:
            word_initials, word_finals = map(list, _pinyin(word))
        else:
            word_initials, word_finals = rt.pinyin_predictor.initials_finals(word, predicted[start:end])
        start = end
        word_finals = rt.sandhi.modified_tone(word, pos, word_finals)
        word_finals = _merge_erhua(word_finals, word, pos)
        initials += word_initials
        finals += word_finals
    return initials, finals


def g2p(norm_text: str, *, data: TextData) -> tuple[list[str], list[int]]:
    """Phones of normalised Chinese text (the output of :func:`text_normalize`) and ``word2ph``:
    for every character of ``norm_text`` the number of its phones (2 for a syllable, 1 for
    punctuation). ``data.g2pw``: g2pW or pypinyin. Raises :class:`TextFrontendError` for text it cannot map."""
    rt = runtime(data.g2pw, data.cache)
    sentences = [s for s in _SENTENCE_SPLIT_RE.split(norm_text) if s.strip()]
    phones: list[str] = []
    word2ph: list[int] = []
    for sentence in sentences:
        checkpoint()
        sentence = _LATIN_RE.sub("", sentence)
        initials, finals = _sentence_syllables(sentence, rt)
        for initial, final in zip(initials, finals):
            if initial == final:
                if initial not in PUNCTUATION:
                    raise TextFrontendError(
                        f"{initial!r} in {sentence!r} has no pinyin and is not punctuation "
                        "(g2p expects the output of text_normalize)"
                    )
                phones.append(initial)
                word2ph.append(1)
            else:
                phones += _syllable_phones(initial, final, sentence)
                word2ph.append(2)
    if len(word2ph) != len(norm_text):
        raise TextFrontendError(
            f"g2p gave {len(word2ph)} syllables/marks for the {len(norm_text)} characters of {norm_text!r} "
            "(g2p expects the output of text_normalize)"
        )
    return phones, word2ph
