"""Property tests: whatever the input, the text front end returns a consistent result or raises
TextFrontendError (never another exception), and finishes in bounded time.

Inputs: random Unicode (every category, including control characters, private use, unassigned code
points and lone surrogates), mixes of Chinese/English/Japanese/Korean/Cantonese/digits/emoji/marks, and
100 000-character texts. Every language option is used, Japanese/Korean/Cantonese included.
"""

from __future__ import annotations

import contextlib
import random
import signal
import time

import pytest
from conftest import load_text_data
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dora_primespeech_mlx.text import (
    SUPPORTED_OPTIONS,
    TextFrontendError,
    get_phones,
    preprocess,
    prompt_phones,
    split_text,
)
from dora_primespeech_mlx.text.segmentation import METHODS
from dora_primespeech_mlx.text.symbols import symbols

DATA = load_text_data()  # the text front end's folders (tests/conftest.py)

OPTIONS = SUPPORTED_OPTIONS  # all_zh zh en auto all_ja ja all_ko ko all_yue yue auto_yue
N_SYMBOLS = len(symbols("v2"))

FRAGMENTS = [
    "你好", "世界", "今天天气不错", "一会儿", "银行", "不是", "第2名", "2024年3月15日", "9:30", "12.5%", "-5℃",
    "Hello", "world", "ChatGPT", "iPhone 15 Pro", "e.g.", "don't", "café", "ＡＢＣ１２３", "NASA", "3rd",
    "，", "。", "！", "？", "、", "：", "；", "…", "……", "——", "~", "～", "!", "?", ".", ",", "-", "'", '"',
    "“", "”", "《", "》", "(", ")", "[", "]", "{", "}", "#", "@", "&", "￥", "^", "_", "|", "\\", "/", "$", "%",
    " ", "  ", "\n", "\n\n", "\r\n", "\t", "\u3000", "\u00a0", "\u200b", "\ufeff",
    "0", "1", "42", "3.14", "1,200", "13812345678", "²", "①", "٣", "Ⅻ",
    "😊", "👍🏽", "👨‍👩‍👧", "❤️", "🇨🇳", "★", "©", "α", "Ω",
    "こんにちは", "カタカナ", "ｶﾀｶﾅ", "今日は", "ー", "っ", "１，９８０円", "１０％", "々", "ゔ", "〜",
    "안녕하세요", "ㄱ", "ㅘ", "읽고", "3개", "11개", "010", "신라", "같이", "ᄀ", "ᅡ", "ퟻ",
    "係咪", "唔該", "㗎", "佢哋", "嘅", "乜嘢", "Привет", "مرحبا", "שלום", "नमस्ते",
    "\x00", "\x07", "\x1b", "\x7f", "\ud800", "\udfff", "\ud83d", "\U0010ffff", "\ue000", "\U000e0001",
    "𠀀", "䶵", "兀",
]

any_unicode = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)
fragment_mix = st.lists(st.sampled_from(FRAGMENTS), max_size=25).map("".join)
texts = st.one_of(any_unicode, fragment_mix, st.lists(st.one_of(any_unicode, fragment_mix), max_size=4).map("".join))

FUZZ = settings(
    max_examples=100,
    deadline=20_000,  # ms per example (random rare Han characters are slow in the Chinese G2P)
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)


@contextlib.contextmanager
def time_limit(seconds: float):
    """Fail (instead of hanging) when the body runs longer than ``seconds`` (Unix: SIGALRM)."""
    if not hasattr(signal, "setitimer"):
        yield
        return

    def on_alarm(signum, frame):
        raise TimeoutError(f"took longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="module", autouse=True)
def _warm_up():
    """Load jieba, pypinyin, the English G2P and the ja/ko/yue libraries once, outside the per-example
    deadline (a missing extra fails here: the dev install has them all)."""
    get_phones("你好，世界。Hello world.", "zh", data=DATA)
    for option, text in (("ja", "こんにちは。"), ("ko", "안녕하세요."), ("yue", "你好。")):
        get_phones(text, option, data=DATA)


def check_result(result):
    assert len(result.phones) == len(result.phone_ids) > 0
    assert all(0 <= i < N_SYMBOLS and symbols("v2")[i] == p for i, p in zip(result.phone_ids, result.phones))
    assert result.phones == tuple(p for s in result.segments for p in s.phones)
    for s in result.segments:
        assert (s.word2ph is not None) == (s.lang in ("zh", "yue"))
        if s.word2ph is not None:
            assert sum(s.word2ph) == len(s.phones)
            assert len(s.word2ph) == len(s.norm_text)
    assert (result.word2ph is not None) == all(s.lang == "zh" for s in result.segments)
    if result.word2ph is not None:
        assert sum(result.word2ph) == len(result.phones)
        assert len(result.word2ph) == len(result.norm_text)


def phones_or_error(text, option):
    try:
        result = get_phones(text, option, data=DATA)
    except TextFrontendError:
        return
    check_result(result)


def preprocess_or_error(text, option, method):
    try:
        chunks = preprocess(text, option, method, data=DATA)
    except TextFrontendError:
        return
    for chunk in chunks:
        assert chunk.norm_text
        check_result(chunk.result)


@FUZZ
@given(text=texts, option=st.sampled_from(OPTIONS))
def test_get_phones_total(text, option):
    with time_limit(60):
        phones_or_error(text, option)


@FUZZ
@given(text=texts, option=st.sampled_from(OPTIONS), method=st.sampled_from(sorted(METHODS)))
def test_preprocess_total(text, option, method):
    with time_limit(60):
        preprocess_or_error(text, option, method)


@FUZZ
@given(text=texts, option=st.sampled_from(OPTIONS))
def test_prompt_total(text, option):
    with time_limit(60):
        try:
            result = prompt_phones(text, option, data=DATA)
        except TextFrontendError:
            return
        if result is not None:
            check_result(result)


@settings(max_examples=300, deadline=2_000, derandomize=True)
@given(text=texts, option=st.sampled_from(OPTIONS), method=st.sampled_from(sorted(METHODS)))
def test_split_text_total(text, option, method):
    try:
        chunks = split_text(text, method, option)
    except TextFrontendError:
        return
    assert all(isinstance(c, str) and c for c in chunks)


# ------------------------------------------------------------------------------ 100 000 characters


def _long_text(seed: int, n: int = 100_000) -> str:
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    while size < n:
        if rng.random() < 0.1:
            piece = "".join(chr(rng.randrange(0x110000)) for _ in range(rng.randrange(1, 8)))
        else:
            piece = rng.choice(FRAGMENTS)
        parts.append(piece)
        size += len(piece)
    return "".join(parts)[:n]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_long_random_unicode_split(seed):
    rng = random.Random(seed)
    text = "".join(chr(rng.randrange(0x110000)) for _ in range(100_000))
    for method in sorted(METHODS):
        with time_limit(30):
            try:
                split_text(text, method, "zh")
            except TextFrontendError:
                pass


@pytest.mark.slow
@pytest.mark.parametrize("option", ["zh", "en", "all_ja", "ko", "yue"])
def test_long_mixed_text(option):
    text = _long_text(seed=len(option))
    start = time.perf_counter()
    with time_limit(300):
        phones_or_error(text, option)
        preprocess_or_error(text, option, "cut5")
    assert time.perf_counter() - start < 300


PARAGRAPH = (
    "今天是2024年3月15日，我用ChatGPT写了3个程序。这个bug已经fix了，请重新test一下！温度是25℃，湿度60%。"
    "Hello, how are you doing today? 他说了一句Thank you very much，然后就走了。"
)


@pytest.mark.slow
def test_long_realistic_text_is_linear():
    """100 000 characters of ordinary mixed text: phonemised whole and chunked, in bounded time."""
    text = (PARAGRAPH * (100_000 // len(PARAGRAPH) + 1))[:100_000]
    one = get_phones(PARAGRAPH, "zh", data=DATA)
    start = time.perf_counter()
    with time_limit(240):
        result = get_phones(text, "zh", data=DATA)
        chunks = preprocess(text, "zh", "cut5", data=DATA)
    check_result(result)
    repeats = 100_000 // len(PARAGRAPH)
    assert len(result.phones) >= repeats * len(one.phones)
    assert sum(len(c.phones) for c in chunks) >= repeats * len(one.phones)
    assert time.perf_counter() - start < 240


PARAGRAPHS_JKC = {
    "ja": "今日は2024年3月15日です。私はあなたのアシスタントです、何かお手伝いできることはありますか？"
    "東京タワーに行きましょう！コーヒーを１杯、９８．５％の確率で。",
    "ko": "안녕하세요. 오늘은 2024년 3월 15일입니다. 사과 3개와 우유 2잔을 샀어요! "
    "책을 읽고 신라의 역사를 같이 공부해요? 전화번호는 010-1234-5678이에요.",
    "yue": "你好，我係你嘅助手。今日係2024年3月15號，天氣幾好呀！我哋一齊去飲茶好唔好？"
    "呢度有3個蘋果，唔該晒。",
}


@pytest.mark.slow
@pytest.mark.parametrize("option", sorted(PARAGRAPHS_JKC))
def test_long_realistic_text_jkc(option):
    """100 000 characters of Japanese / Korean / Cantonese: phonemised whole and chunked, in bounded time."""
    paragraph = PARAGRAPHS_JKC[option]
    text = (paragraph * (100_000 // len(paragraph) + 1))[:100_000]
    one = get_phones(paragraph, option, data=DATA)
    start = time.perf_counter()
    with time_limit(240):
        result = get_phones(text, option, data=DATA)
        chunks = preprocess(text, option, "cut5", data=DATA)
    check_result(result)
    repeats = 100_000 // len(paragraph)
    # chunking drops the spaces/marks at chunk borders, so the chunks may hold a few phones less
    assert len(result.phones) >= repeats * len(one.phones)
    assert sum(len(c.phones) for c in chunks) >= 0.9 * repeats * len(one.phones)
    assert time.perf_counter() - start < 240
