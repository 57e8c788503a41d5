"""Every text stage runs in time linear in its input: each stage is timed on adversarial texts (whitespace runs,
open openers, nested marks, long tables, digit runs, repeated list markers) of 1 000 and 4 000 characters, and
the ratio of the medians of a few runs must stay near 4 (linear); a quadratic stage gives ~16, a cubic one ~64.

A stage fails when the ratio is above ``MAX_RATIO`` and its 4 000-character time is above ``FLOOR_S`` (so noise on
times of a few milliseconds cannot fail it), or when one run takes longer than ``BUDGET_S`` (a cubic pattern
would run for minutes: the run is interrupted, the re module checks signals while it matches)."""

from __future__ import annotations

import contextlib
import functools
import signal
import statistics
import time

import pytest
from conftest import load_text_data

from dora_primespeech_mlx.dataflow.sentences import LlmFeed, SentenceCutter
from dora_primespeech_mlx.dataflow.utterance import Fragment, Utterance
from dora_primespeech_mlx.text import en_normalization as en
from dora_primespeech_mlx.text import get_phones, split_languages, split_text
from dora_primespeech_mlx.text.llm import StreamFilter, clean
from dora_primespeech_mlx.text.zh_normalization import normalizer as zh

DATA = load_text_data()  # the text front end's folders (tests/conftest.py)

SIZES = (1000, 4000)
MAX_RATIO = 10.0
FLOOR_S = 0.05
BUDGET_S = 10.0
REPEATS = 3

#: (name, prefix, repeated unit, suffix): the unit fills the text to the size between prefix and suffix
HOSTILE = [
    ("spaces", "x", " ", "x"),
    ("tabs then newline", "x", "\t", "\n!"),
    ("code fence then spaces", "```", " ", "!"),
    ("code fence then tabs", "```", "\t", "!"),
    ("quoted fence then spaces", "> ```", " ", "!"),
    ("tilde fence then spaces", "~~~", " ", "x"),
    ("heading then spaces", "# a", " ", "#x"),
    ("open think tag", "<think", " ", "x"),
    ("think openers", "", "<think ", "x"),
    ("think tags cut", "", "<th", "ink>"),
    ("backticks", "", "`", "x"),
    ("open brackets", "", "[", "x"),
    ("open link targets", "[a](", "(", "x"),
    ("open parens", "", "(", "x"),
    ("bold openers", "", "**", "x"),
    ("bold line then spaces", "**a**", " ", "x"),
    ("pipes", "", "|", "x"),
    ("table separator then spaces", "|---|---|", " ", "x"),
    ("long table", "| a | b |\n|---|---|\n", "| 1 | 2 |\n", ""),
    ("nested quote lists", "", "> - ", "x"),
    ("nested lists", "", "  - 1. ", "x"),
    ("list markers", "", "1. ", ""),
    ("list lines", "", "1) a\n", ""),
    ("bullets", "", "- ", "x"),
    ("digits", "", "9", ""),
    ("digits then a unit", "", "9", "度"),
    ("decimal points", "", "1.", ""),
    ("spaced emoji", "", "👍 ", "x"),
    ("emoji then spaces", "a👍", " ", "x"),
    ("html attributes", "<b", " a=b", "x"),
    ("e-mail openers", "", "a@", "b.com"),
    ("url dots", "http://", "a.", "!"),
    ("emphasis underscores", "", "_a", "x"),
    ("chinese and digits", "", "第9", "。"),
]


#: runs of end marks, closers and quotes: what the dataflow's sentence assembly walks (issue 50, form 5)
END_MARKS = [
    ("full-width end marks", "", "。", ""),
    ("full-width end marks then a letter", "", "。", "x"),
    ("mixed end marks", "a", "。！？!?…", "b"),
    ("dots then a letter", "a", ".", "b"),
    ("dots then a space", "a", ".", " b"),
    ("closers", "a。", "”）」", "x"),
    ("straight quotes", "a.", "'\"", "x"),
    ("end marks and spaces", "", "。 ", ""),
    ("sentences", "", "好。", ""),
    ("numbered dots", "1", ".", " x"),
    ("code span then marks", "`", "。", "x"),
]


def _assemble(text: str, step: int, llm_text: bool = True) -> list[str]:
    """The dataflow's sentence assembly (LLM feed, sentence cutter) fed ``step`` characters at a time."""
    feed, cutter = LlmFeed(StreamFilter() if llm_text else None), SentenceCutter()
    out = []
    for i in range(0, len(text), step):
        out += cutter.push(feed.push(text[i:i + step]))
    return out + cutter.push(feed.finish()) + cutter.finish()


def _utterance(text: str) -> list[str]:
    """An utterance joined from one-character fragments whose pairs arrive swapped (each first one held)."""
    u = Utterance(("s", "1"), {}, None, LlmFeed(StreamFilter()))
    n = len(text)
    order = [j for i in range(0, n, 2) for j in (i + 1, i) if j < n]
    out = []
    for k in order:
        for ready in u.accept(Fragment(text[k], k, k == n - 1)):
            out += u.sentences_of(ready)
    return out


def _fragments(text: str) -> str:
    f = StreamFilter()
    return "".join(f.feed_fragment(text[i:i + 4]) for i in range(0, len(text), 4)) + f.flush()


def _segment(text: str, method: str) -> list[str]:
    return split_text(text, method, "zh")


STAGES = {
    "llm.clean": clean,
    "llm.StreamFilter.feed": lambda t: StreamFilter().feed(t),
    "llm.StreamFilter.feed_fragment": _fragments,
    "zh normalisation": zh.normalize,
    "en normalisation": en.normalize,
    "language split": lambda t: split_languages(t, "auto"),
    **{f"segmentation {m}": functools.partial(_segment, method=m) for m in ("cut0", "cut1", "cut2", "cut3", "cut4",
                                                                             "cut5")},
    "get_phones zh": lambda t: get_phones(t, "zh", data=DATA),
    "get_phones en": lambda t: get_phones(t, "en", data=DATA),
    "get_phones auto": lambda t: get_phones(t, "auto", data=DATA),
}

#: the node's own text handling (dataflow/sentences.py, utterance.py): whole, fragment by fragment, LLM stage off
DATAFLOW_STAGES = {
    "dataflow sentences, whole": functools.partial(_assemble, step=10**9),
    "dataflow sentences, one character a fragment": functools.partial(_assemble, step=1),
    "dataflow sentences, three characters a fragment, LLM stage off": functools.partial(_assemble, step=3,
                                                                                         llm_text=False),
    "dataflow utterance, fragments out of order": _utterance,
}


def build(prefix: str, unit: str, suffix: str, n: int) -> str:
    return prefix + unit * max(1, (n - len(prefix) - len(suffix)) // len(unit)) + suffix


class _Overrun(BaseException):  # not caught by the stages' own error handling
    pass


@contextlib.contextmanager
def _budget(seconds: float):
    def alarm(signum, frame):
        raise _Overrun

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _run(stage, text: str) -> None:
    try:
        stage(text)
    except Exception:  # noqa: BLE001 - refusing a text (a 4 000-digit number) is an answer too; its time counts
        pass  # (which errors each stage may raise is test_fuzz.py's business)


def _time(stage, text: str) -> float:
    t0 = time.perf_counter()
    try:
        with _budget(BUDGET_S):
            _run(stage, text)
    except _Overrun:
        pytest.fail(f"one run on {text[:12]!r}... ({len(text)} characters) took more than {BUDGET_S} s",
                    pytrace=False)
    return time.perf_counter() - t0


def growth(stage, prefix: str, unit: str, suffix: str) -> tuple[float, float]:
    """(ratio of the medians at 4 000 and 1 000 characters, median seconds at 4 000)."""
    small, large = (build(prefix, unit, suffix, n) for n in SIZES)
    t_large = statistics.median(_time(stage, large) for _ in range(REPEATS))
    if t_large <= FLOOR_S:
        return 0.0, t_large
    t_small = statistics.median(_time(stage, small) for _ in range(REPEATS))
    return t_large / max(t_small, 1e-6), t_large


_SLOW = {"get_phones zh", "get_phones en", "get_phones auto"}  # a minute together: the --full tier


@pytest.mark.parametrize("stage", [pytest.param(s, marks=[pytest.mark.slow] if s in _SLOW else [])
                                   for s in [*STAGES, *DATAFLOW_STAGES]])
def test_stage_is_linear_on_hostile_text(stage):
    fn = STAGES[stage] if stage in STAGES else DATAFLOW_STAGES[stage]
    _run(fn, "Hello 1. 你好，2024年。")  # the first call loads libraries and dictionaries: not timed
    slow = []
    for name, prefix, unit, suffix in HOSTILE + (END_MARKS if stage in DATAFLOW_STAGES else []):
        ratio, t_large = growth(fn, prefix, unit, suffix)
        if ratio > MAX_RATIO:
            # a second measurement before failing: a loaded machine can stall one run
            ratio, t_large = growth(fn, prefix, unit, suffix)
        if ratio > MAX_RATIO:
            slow.append(f"{name}: x{ratio:.1f} from 1 000 to 4 000 characters ({t_large * 1000:.0f} ms)")
    assert not slow, f"{stage} grows faster than linear: " + "; ".join(slow)
