"""Optional g2pW polyphone prediction (upstream's ``G2PWPinyin``, ``is_g2pw = True`` branch).

Off by default: the reference fixtures and this package's default use pypinyin. It is used only when
the caller switches it on (:class:`G2PWOptions` with the model folder, ``<model_dir>/G2PWModel``
(:func:`g2pw_dir`), passed to the front end in its :class:`~.options.TextData`; the engine builds it from
its settings), ``onnxruntime`` is installed and that folder holds the
g2pW export (``g2pW.onnx``, ``POLYPHONIC_CHARS.txt``, ``MONOPHONIC_CHARS.txt``,
``bopomofo_to_pinyin_wo_tune_dict.json``, ``char_bopomofo_dict.json``, ``config.py``) plus a BERT
``vocab.txt`` (in that folder, or another one named by :attr:`G2PWOptions.vocab`). Upstream's word fixes
(``polyphonic.rep``, ``polyphonic-fix.rep``) are applied when they are in that folder too, and
``opencc`` (s2tw, as upstream) when it is installed.

Status: written from upstream's description and code structure, NOT verified against a real g2pW
model (none is available to this project's tests).
"""

from __future__ import annotations

import ast
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .zh_normalization import to_simplified

logger = logging.getLogger(__name__)

REQUIRED_FILES = (
    "g2pW.onnx",
    "POLYPHONIC_CHARS.txt",
    "MONOPHONIC_CHARS.txt",
    "bopomofo_to_pinyin_wo_tune_dict.json",
    "char_bopomofo_dict.json",
)
# Upstream never predicts these (they are left to pypinyin / tone sandhi) ...
_NOT_POLYPHONIC = frozenset("一不和咋嗲剖差攢倒難奔勁拗肖瘙誒泊听噢")
# ... and does not trust the monophonic table for these.
_NOT_MONOPHONIC = frozenset("似攢")
_CONTEXT_CHARS = 16  # characters of context kept around the polyphones (upstream's default)


def g2pw_dir(model_dir: Path) -> Path:
    """Where the g2pW export lives inside a model directory."""
    return Path(model_dir) / "G2PWModel"


@dataclass(frozen=True)
class G2PWOptions:
    enabled: bool = False  # use g2pW for polyphones (else pypinyin)
    vocab: str | None = None  # the BERT vocab.txt (default: the one in the G2PWModel folder)
    folder: str | None = None  # the g2pW export (g2pw_dir of the model directory); None: none given


def load_predictor(options: G2PWOptions) -> G2PWPredictor | None:
    """A predictor when ``options`` switch g2pW on and it is usable; otherwise ``None`` (pypinyin is used)."""
    if not options.enabled:
        logger.info("g2pW is not in use (switched off): Chinese pinyin comes from pypinyin")
        return None
    if options.folder is None:
        logger.warning("g2pW is switched on but no g2pW model folder was given; using pypinyin")
        return None
    folder = Path(options.folder)
    missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
    if missing:
        logger.warning("g2pW is switched on but %s lacks %s; using pypinyin", folder, ", ".join(missing))
        return None
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        logger.warning("g2pW is switched on but onnxruntime is not installed; using pypinyin")
        return None
    return G2PWPredictor(folder, options.vocab)


def _read_config(path: Path) -> dict:
    """Plain ``name = literal`` assignments of the export's config.py (not executed)."""
    values = {}
    if path.is_file():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                try:
                    values[node.targets[0].id] = ast.literal_eval(node.value)
                except ValueError:
                    continue
    return values


def read_word_fixes(*paths: Path) -> dict[str, list[str]]:
    """``word: ['pin1', 'yin1']`` lines of upstream's polyphonic*.rep files (later files win)."""
    fixes: dict[str, list[str]] = {}
    for path in paths:
        if not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            if ":" in line:
                key, value = line.split(":", 1)
                fixes[key.strip()] = list(ast.literal_eval(value.strip()))
    return fixes


def split_pinyin(pinyins: list[str]) -> tuple[list[str], list[str]]:
    """TONE3 pinyin (``"hang2"``) -> pypinyin initials and finals; punctuation stays as both."""
    from pypinyin.contrib.tone_convert import to_finals_tone3, to_initials  # (Chinese only: see _predict)

    initials, finals = [], []
    for item in pinyins:
        if item[:1].isalpha():
            initials.append(to_initials(item))
            finals.append(to_finals_tone3(item, neutral_tone_with_five=True))
        else:
            initials.append(item)
            finals.append(item)
    return initials, finals


class G2PWPredictor:
    """Per-character pinyin of a sentence, polyphones predicted by the g2pW ONNX classifier."""

    def __init__(self, folder: Path, vocab: str | os.PathLike | None = None):
        import onnxruntime
        from tokenizers import BertWordPieceTokenizer

        config = _read_config(folder / "config.py")
        self.use_mask = bool(config.get("use_mask", True))
        self.use_char_phoneme = bool(config.get("use_char_phoneme", False))

        rows = [line.split("\t") for line in (folder / "POLYPHONIC_CHARS.txt").read_text("utf-8").strip().split("\n")]
        # labels: the model's output classes ("char pinyin" or just the bopomofo syllable)
        names = [f"{c} {p}" if self.use_char_phoneme else p for c, p in rows]
        self.labels = sorted(set(names))
        label_of = {label: i for i, label in enumerate(self.labels)}
        pairs = [(c, label_of[name]) for (c, _), name in zip(rows, names)]
        self.char_labels: dict[str, list[int]] = {}
        for char, label in pairs:
            self.char_labels.setdefault(char, []).append(label)
        self.chars = sorted(self.char_labels)
        self.char_id = {c: i for i, c in enumerate(self.chars)}
        self.polyphonic = set(self.chars) - _NOT_POLYPHONIC

        mono = (folder / "MONOPHONIC_CHARS.txt").read_text("utf-8").strip().split("\n")
        self.monophonic = {c: p for c, p in (line.split("\t") for line in mono) if c not in _NOT_MONOPHONIC}
        self.bopomofo_to_pinyin = json.loads((folder / "bopomofo_to_pinyin_wo_tune_dict.json").read_text("utf-8"))
        self.word_fixes = read_word_fixes(folder / "polyphonic.rep", folder / "polyphonic-fix.rep")
        if not self.word_fixes:
            logger.info("g2pW: no polyphonic.rep in %s, word-level pinyin fixes are not applied", folder)

        vocab = os.fspath(vocab) if vocab else str(folder / "vocab.txt")
        self.tokenizer = BertWordPieceTokenizer(vocab, lowercase=True)
        try:
            from opencc import OpenCC

            self.to_traditional = OpenCC("s2tw").convert
        except ImportError:
            logger.warning("g2pW: opencc is not installed, the model sees simplified text (upstream: s2tw)")
            self.to_traditional = None
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 2
        self.session = onnxruntime.InferenceSession(
            str(folder / "g2pW.onnx"), sess_options=options, providers=["CPUExecutionProvider"]
        )

    def _bopomofo_pinyin(self, bopomofo: str) -> str | None:
        base = self.bopomofo_to_pinyin.get(bopomofo[:-1])
        return base + bopomofo[-1] if base else None

    def predict(self, sentence: str) -> list[str]:
        """TONE3 pinyin for every character of ``sentence`` (punctuation as itself)."""
        if self.to_traditional is not None:
            converted = self.to_traditional(sentence)
            sentence = converted if len(converted) == len(sentence) else sentence
        from pypinyin import Style, pinyin  # (here: the module's options load with every front end, pypinyin is zh)

        fallback = [p[0] for p in pinyin(to_simplified(sentence), neutral_tone_with_five=True, style=Style.TONE3)]
        result: list[str | None] = []
        queries = []
        for i, char in enumerate(sentence):
            if char in self.polyphonic:
                queries.append(i)
                result.append(None)
            elif char in self.monophonic:
                result.append(self._bopomofo_pinyin(self.monophonic[char]))
            else:
                result.append(fallback[i] if i < len(fallback) else char)
        if queries:
            left = max(0, queries[0] - _CONTEXT_CHARS)
            right = min(len(sentence), queries[-1] + _CONTEXT_CHARS + 1)
            for i, label in zip(queries, self._classify(sentence[left:right], [q - left for q in queries])):
                if self.use_char_phoneme:
                    label = label.split(" ")[1]
                result[i] = self._bopomofo_pinyin(label)
        return [p if p else (fallback[i] if i < len(fallback) else c) for i, (p, c) in enumerate(zip(result, sentence))]

    def _classify(self, text: str, positions: list[int]) -> list[str]:
        """Run the classifier once for the polyphones at ``positions`` of ``text``."""
        text = text.lower()
        tokens, text_to_token = [], []
        for char in text:  # one "word" per character: normalised Chinese has no latin runs
            text_to_token.append(len(tokens))
            tokens += self.tokenizer.encode(char, add_special_tokens=False).tokens or ["[UNK]"]
        unk = self.tokenizer.token_to_id("[UNK]")
        ids = [self.tokenizer.token_to_id(t) for t in ["[CLS]", *tokens, "[SEP]"]]
        ids = [unk if i is None else i for i in ids]
        n = len(positions)
        masks = np.ones((n, len(self.labels)), np.float32)
        if self.use_mask:
            masks[:] = 0
            for row, pos in enumerate(positions):
                masks[row, self.char_labels[text[pos]]] = 1
        feeds = {
            "input_ids": np.tile(np.asarray(ids, np.int64), (n, 1)),
            "token_type_ids": np.zeros((n, len(ids)), np.int64),
            "attention_mask": np.ones((n, len(ids)), np.int64),
            "phoneme_mask": masks,
            "char_ids": np.asarray([self.char_id.get(text[p], 0) for p in positions], np.int64),
            "position_ids": np.asarray([text_to_token[p] + 1 for p in positions], np.int64),  # +1: [CLS]
        }
        probs = self.session.run(None, feeds)[0]
        return [self.labels[i] for i in np.argmax(probs, axis=1)]

    def initials_finals(self, word: str, pinyins: list[str]) -> tuple[list[str], list[str]]:
        """Apply upstream's word fixes (whole word, else per character), then split."""
        fixed = self.word_fixes.get(word)
        if fixed is None:
            fixed = list(pinyins)
            for i, char in enumerate(word):
                if char in self.word_fixes and i < len(fixed):
                    fixed[i] = self.word_fixes[char][0]
        return split_pinyin(fixed)
