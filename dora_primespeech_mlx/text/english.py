"""English front end of GPT-SoVITS v2 (``text/english.py``): text -> normalised text -> ARPAbet phones.

* :func:`text_normalize` maps ``。！？`` to ``.!?``, spells out numbers and symbols
  (:mod:`.en_normalization`) and collapses repeated punctuation.
* :func:`g2p` turns the normalised text into phones of the v2 symbol table.

Words are pronounced by, in order: the POS-tagged homograph table of ``g2p_en`` (with upstream's fixes
for *read* and *complex*), upstream's own dictionary (``cmudict.rep`` from line 57, ``cmudict-fast.rep``
for new words, ``engdict-hot.rep`` overriding both, minus AE AI AR IOS HUD OS), the name dictionary
for Title-case words, spelling for words of up to three letters, the possessive ``'s`` rule,
``wordsegment`` compounds, and finally ``g2p_en``'s neural model. Upstream's ``","`` in front of a segment of
fewer than 4 phones (``"bug"`` -> ``, B AH1 G``) belongs to the pipeline, which calls this module."""

from __future__ import annotations

import functools
import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path

from .budget import checkpoint
from .data import data_file, ensure_nltk_data
from .en_normalization import import_inflect, normalize
from .errors import TextFrontendError
from .options import TextData

logger = logging.getLogger(__name__)

# ------------------------------------------------------------------------------------ normalisation

# Upstream escapes these keys with re.escape, so the two bracket "classes" only match their own literal
# text: ";:，；" and quotes are not turned into "," / "'" here (the character filter deletes them later).
_PUNCT_MAP = {"[;:：，；]": ",", '["’]': "'", "。": ".", "！": "!", "？": "?"}
_PUNCT_MAP_RE = re.compile("|".join(re.escape(key) for key in _PUNCT_MAP))

# v1/v2 punctuation symbols. A mark (or whitespace) followed by marks keeps only the first character,
# so a mark after a space disappears: "a , b" -> "a  b".
PUNCTUATION = ("!", "?", "…", ",", ".", "-")
_MARKS = "".join(re.escape(p) for p in PUNCTUATION)
_REPEATED_PUNCT_RE = re.compile(f"([{_MARKS}\\s])([{_MARKS}])+")


def text_normalize(text: str) -> str:
    """Normalise one English segment the way upstream ``english.text_normalize`` does."""
    text = _PUNCT_MAP_RE.sub(lambda m: _PUNCT_MAP[m.group()], text)
    text = normalize(text)
    return _REPEATED_PUNCT_RE.sub(r"\1", text)


# ------------------------------------------------------------------------------------------ symbols

# Upstream's `arpa` set: the ARPAbet part of the v2 symbol table.
ARPA = frozenset(
    """AA0 AA1 AA2 AE0 AE1 AE2 AH0 AH1 AH2 AO0 AO1 AO2 AW0 AW1 AW2 AY0 AY1 AY2 B CH D DH EH0 EH1 EH2
    ER ER0 ER1 ER2 EY0 EY1 EY2 F G HH IH IH0 IH1 IH2 IY0 IY1 IY2 JH K L M N NG OW0 OW1 OW2 OY0 OY1 OY2
    P R S SH T TH UH0 UH1 UH2 UW0 UW1 UW2 V W Y Z ZH""".split()
)

# Every v2 symbol the English G2P can produce: other v2 symbols (Chinese, Japanese, ...) never come out
# of the dictionaries, the neural model or the tokenizer (tokens without letters are made of '.,?!-).
_V2_ENGLISH = ARPA | set(PUNCTUATION) | {"UNK"}
_NOT_PHONES = frozenset({" ", "<pad>", "UW", "</s>", "<s>"})


# ----------------------------------------------------------------------------------- dictionaries

_REMOVED_WORDS = ("ae", "ai", "ar", "ios", "hud", "os")  # misread abbreviations upstream deletes
_CMU_FIRST_LINE = 57  # cmudict.rep: lines before this are the licence header


def english_dictionary(*, data: TextData) -> Pronunciations:
    """Lower-case word -> phones, built like upstream ``get_dict()`` (first pronunciation only), from the
    dictionaries in ``data.folder``; built once per folder, and read from a prepared copy in ``data.cache``
    (when set) after the first time (:func:`prepared_dictionary`)."""
    return _english_dictionary(Path(data.folder), None if data.cache is None else Path(data.cache))


class Pronunciations(Mapping):
    """Word -> phones (a new list at each lookup). Kept as each entry's phone string, split on lookup: ~140 000
    strings instead of ~140 000 lists of ~850 000 phone strings, so building it (or reading it prepared) and
    collecting around it cost a fraction. An entry that is a list (a ``-fast``/``-hot`` line without phones) is
    returned as it is."""

    def __init__(self, raw: dict[str, str | list[str]]):
        self.raw = raw

    def __getitem__(self, word: str) -> list[str]:
        phones = self.raw[word]
        return phones.split(" ") if isinstance(phones, str) else list(phones)

    def __contains__(self, word: object) -> bool:
        return word in self.raw

    def __iter__(self):
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)


_SOURCES = ("cmudict.rep", "cmudict-fast.rep", "engdict-hot.rep")
_PREPARED_FORMAT = 1  # bump when the prepared form or the parsing below changes


@functools.lru_cache(maxsize=4)
def _english_dictionary(folder: Path, cache: Path | None) -> Pronunciations:
    data = TextData(folder, folder)  # only its dictionary folder is used
    paths = [data_file(name, data=data) for name in _SOURCES]
    return Pronunciations(prepared_dictionary(paths, cache) if cache is not None else _parse_dictionaries(*paths))


def prepared_dictionary(paths: list[Path], cache: Path) -> dict[str, str | list[str]]:
    """The parsed dictionaries, from ``cache/english-dict-<hash>.marshal`` (the hash: of the three source files'
    bytes and the format) when there, else parsed and written there for the next start (a failure to write only
    logs). A damaged or foreign file is parsed again."""
    import hashlib
    import marshal

    digest = hashlib.sha256(str(_PREPARED_FORMAT).encode())
    for path in paths:
        digest.update(path.read_bytes())
    target = cache / f"english-dict-{digest.hexdigest()[:24]}.marshal"
    try:
        raw = marshal.loads(target.read_bytes())
        if isinstance(raw, dict):
            return raw
    except (OSError, ValueError, EOFError, TypeError):
        pass
    raw = _parse_dictionaries(*paths)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".{os.getpid()}.part")
        partial.write_bytes(marshal.dumps(raw))
        os.replace(partial, target)
    except OSError as exc:
        logger.info("the prepared English dictionary was not written to %s: %s", cache, exc)
    return raw


_TAGGER_FORMAT = 1  # bump when the prepared form of NLTK's tagger changes


def prepared_pos_tag(cache: Path | None) -> Callable[[list[str]], list[tuple[str, str]]]:
    """``nltk.pos_tag`` (English, no tagset: NLTK's averaged perceptron tagger), with the tagger's three parameter
    files (JSON, ~0.4 s to parse) read from a prepared marshal copy in ``cache`` (``nltk-tagger-eng-<hash>``, the
    hash: of the three files' bytes and the format) when there, else loaded by NLTK and written there for the next
    start (a failure to write only logs; a damaged or foreign copy is loaded by NLTK again, with a DEBUG line).
    ``cache`` None, or NLTK's tagger not in a plain folder: ``nltk.pos_tag`` itself."""
    import hashlib
    import marshal

    import nltk
    from nltk.tag.perceptron import PerceptronTagger

    if cache is None:
        return nltk.pos_tag
    try:
        folder = Path(nltk.data.find("taggers/averaged_perceptron_tagger_eng/").path)
        files = [folder / name for name in PerceptronTagger(load=False).param_files("eng")]
        digest = hashlib.sha256(str(_TAGGER_FORMAT).encode())
        for path in files:
            digest.update(path.read_bytes())
    except (LookupError, AttributeError, OSError):
        return nltk.pos_tag
    target = Path(cache) / f"nltk-tagger-eng-{digest.hexdigest()[:24]}.marshal"
    tagger = PerceptronTagger(load=False)
    try:
        weights, tagdict, classes = marshal.loads(target.read_bytes())
        if not (isinstance(weights, dict) and isinstance(tagdict, dict) and isinstance(classes, list) and classes):
            raise ValueError("not a tagger's parameters")
        tagger.decode_json_params((weights, tagdict, classes))
    except FileNotFoundError:
        tagger = None
    except (OSError, ValueError, EOFError, TypeError) as exc:
        logger.debug("prepared NLTK tagger %s ignored (%s); NLTK loads its own", target, exc)
        tagger = None
    if tagger is None:
        tagger = PerceptronTagger()  # NLTK's own load (its JSON files)
        try:
            Path(cache).mkdir(parents=True, exist_ok=True)
            partial = target.with_suffix(f".{os.getpid()}.part")
            partial.write_bytes(marshal.dumps(tagger.encode_json_obj()))
            os.replace(partial, target)
        except OSError as exc:
            logger.info("the prepared NLTK tagger was not written to %s: %s", cache, exc)
    return tagger.tag  # (what nltk.pos_tag(tokens) returns for English without a tagset)


def _parse_dictionaries(cmu: Path, fast: Path, hot: Path) -> dict[str, str | list[str]]:
    """Upstream's parsing (``cmudict.rep`` from line 57: word, two spaces, phones; the other two: word, space,
    phones; ``engdict-hot.rep`` overrides), each entry's phones kept as their string."""
    words: dict[str, str | list[str]] = {}
    with open(cmu, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if number >= _CMU_FIRST_LINE:
                fields = line.strip().split("  ")  # word, two spaces, phones
                words[fields[0].lower()] = fields[1]
    with open(fast, encoding="utf-8") as f:
        for line in f:
            word, space, phones = line.strip().partition(" ")
            words.setdefault(word.lower(), phones if space else [])
    with open(hot, encoding="utf-8") as f:
        for line in f:
            word, space, phones = line.strip().partition(" ")
            words[word.lower()] = phones if space else []
    for word in _REMOVED_WORDS:
        words.pop(word, None)
    return words


def name_dictionary(*, data: TextData) -> dict[str, list[str]]:
    """Lower-case name -> phones (first pronunciation) from upstream's name dictionary in ``data.folder``;
    built once per folder."""
    return _name_dictionary(Path(data.folder))


@functools.lru_cache(maxsize=4)
def _name_dictionary(folder: Path) -> dict[str, list[str]]:
    with open(data_file("namedict.json", data=TextData(folder, folder)), encoding="utf-8") as f:
        names = json.load(f)
    return {name: prons[0] for name, prons in names.items()}


# ---------------------------------------------------------------------------------------------- G2P

_HAS_LETTER = re.compile("[a-z]")
#: Longer words are refused: the English words are shorter, and the compound splitter and the neural predictor
#: take about a second on a "word" of hundreds of letters (docs/languages.md#time-per-text).
MAX_WORD_CHARS = 64
_POSSESSIVE = re.compile(r"^([a-z]+)('s)$")
_VOICELESS = frozenset({"P", "T", "K", "F", "TH", "HH"})  # 's -> S
_SIBILANT = frozenset({"S", "Z", "SH", "ZH", "CH", "JH"})  # 's -> AH0 Z; anything else -> Z


class EnglishG2p:
    """Word-level pronunciation with upstream's lookup order. Build it with :func:`english_g2p`."""

    def __init__(self, data: TextData) -> None:
        ensure_nltk_data(data=data)  # before g2p_en is imported: it downloads missing NLTK data on import
        import_inflect()  # (g2p_en imports it: without typeguard's instrumentation, see there)
        from nltk.tokenize import TweetTokenizer

        self._model = _g2p_en_model()  # the neural predictor and the homograph table
        self.cmu = english_dictionary(data=data)
        self.names = name_dictionary(data=data)
        self.homographs = dict(self._model.homograph2features)
        self.homographs["read"] = (["R", "IY1", "D"], ["R", "EH1", "D"], "VBP")
        self.homographs["complex"] = (
            ["K", "AH0", "M", "P", "L", "EH1", "K", "S"],
            ["K", "AA1", "M", "P", "L", "EH0", "K", "S"],
            "JJ",
        )
        self._tokenize = TweetTokenizer().tokenize
        self._pos_tag = prepared_pos_tag(None if data.cache is None else Path(data.cache))

    def __call__(self, text: str) -> list[str]:
        """Raw phones of ``text`` (before the symbol-table mapping)."""
        phones: list[str] = []
        for token, pos in self._pos_tag(self._tokenize(text)):
            checkpoint()
            word = token.lower()
            if _HAS_LETTER.search(word) is None:
                phones.append(word)  # punctuation passes through
            elif len(word) == 1:
                phones.extend(["EY1"] if token == "A" else self._letter(word))
            elif word in self.homographs:
                pron1, pron2, pos1 = self.homographs[word]
                # A tag shorter than pos1 that starts it also picks pron1 (only "read"/"VBP": "VB").
                if pos.startswith(pos1) or (len(pos) < len(pos1) and pos == pos1[: len(pos)]):
                    phones.extend(pron1)
                else:
                    phones.extend(pron2)
            else:
                phones.extend(self.word(token))
        return phones

    def word(self, token: str) -> list[str]:
        """Phones of one token (upstream ``qryword``); ``token`` keeps its case for the name lookup."""
        word = token.lower()
        if len(word) > 1 and word in self.cmu:
            return self.cmu[word]
        if token.istitle() and word in self.names:
            return self.names[word]
        if len(word) <= 3:  # short unknown words are spelled
            phones: list[str] = []
            for ch in word:
                if ch == "a":
                    phones.append("EY1")
                elif not ch.isalpha():
                    phones.append(ch)
                else:
                    phones.extend(self._letter(ch))
            return phones
        if _POSSESSIVE.match(word):
            phones = list(self.word(word[:-2]))
            if not phones:
                raise TextFrontendError(f"no pronunciation for the stem of {token!r}")
            if phones[-1] in _VOICELESS:
                phones.append("S")
            elif phones[-1] in _SIBILANT:
                phones.extend(["AH0", "Z"])
            else:
                phones.append("Z")
            return phones
        if len(word) > MAX_WORD_CHARS:  # the splitter and the neural predictor take long on such a "word"
            raise TextFrontendError(f"the word {token[:24]!r}... has {len(word)} characters; the English front end "
                                    f"reads words of up to {MAX_WORD_CHARS}")
        parts = _segment(word)
        if len(parts) == 1:
            return self._model.predict(word)
        return [ph for part in parts for ph in self.word(part)]

    def _letter(self, ch: str) -> list[str]:
        try:
            return self.cmu[ch]
        except KeyError:
            raise TextFrontendError(f"no pronunciation for the letter {ch!r}") from None


def _g2p_en_model():
    """g2p_en's ``G2p`` without the NLTK CMU dictionary its constructor parses (~130 000 entries): this front end
    looks words up in upstream's own dictionaries (:func:`english_dictionary`) and uses ``G2p`` only for its neural
    predictor (``predict``) and its homograph table, neither of which reads it."""
    import g2p_en.g2p as module

    class NoCmu:
        @staticmethod
        def dict() -> dict:
            return {}

    cmudict, module.cmudict = module.cmudict, NoCmu
    try:
        return module.G2p()
    finally:
        module.cmudict = cmudict


def english_g2p(*, data: TextData) -> EnglishG2p:
    """The shared :class:`EnglishG2p` of ``data``'s folders (loads dictionaries, NLTK data and the neural model
    once per set of folders; the dictionaries from their prepared copy in ``data.cache`` when set)."""
    return _english_g2p(Path(data.folder), Path(data.nltk_folder), None if data.cache is None else Path(data.cache))


@functools.lru_cache(maxsize=4)
def _english_g2p(folder: Path, nltk_folder: Path, cache: Path | None) -> EnglishG2p:
    return EnglishG2p(TextData(folder, nltk_folder, cache=cache))  # (the prepared dictionaries' folder too)


@functools.lru_cache(maxsize=1)
def _wordsegment():
    import wordsegment

    wordsegment.load()
    return wordsegment


def _segment(word: str) -> list[str]:
    return _wordsegment().segment(word)


def g2p(norm_text: str, *, data: TextData) -> list[str]:
    """Phones of normalised English text, as v2 symbols (upstream ``english.g2p`` + ``replace_phs``).

    ``<unk>`` becomes ``UNK``, ``'`` becomes ``-``, separators/``UW``/sentence marks and anything else
    outside the v2 table are dropped. The ``","`` prefix for fewer than 4 phones is the caller's job.
    ``data``: where the dictionaries and NLTK data are.
    """
    phones: list[str] = []
    for ph in english_g2p(data=data)(norm_text):
        if ph in _NOT_PHONES:
            continue
        if ph == "<unk>":
            ph = "UNK"
        if ph in _V2_ENGLISH:
            phones.append(ph)
        elif ph == "'":
            phones.append("-")
        else:
            logger.debug("dropping %r: not a v2 symbol", ph)
    return phones
