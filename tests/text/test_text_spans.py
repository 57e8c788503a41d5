"""text.spans.piece_spans: the pieces every cut method makes of a text lie in it as spans that tile it, each span
holding its piece's letters and digits."""

from __future__ import annotations

import random
import re

import pytest

from dora_primespeech_mlx.text.segmentation import METHODS, split_text
from dora_primespeech_mlx.text.spans import piece_spans

TEXTS = [
    "今天天气很好，我们去公园散步吧。公园里有很多花！明天见。",
    "Hello there, how are you today? I am fine... thanks!! See you soon.",
    "我们用 Python 写代码，it is fun. 好的——再见……“真的”吗？",
    "  Leading space. 3.5 apples, 12.3% more; (yes) [no] “quoted.” End",
    "Hi. Ok! No? 嗯。",
]


def words(s: str) -> str:
    return re.sub(r"[\W]", "", s)


def check(text: str, pieces: list[str]) -> None:
    spans = piece_spans(text, pieces)
    assert len(spans) == len(pieces)
    at = 0
    for a, b in spans:
        assert a == at and b >= a
        at = b
    assert at == len(text)
    assert "".join(words(text[a:b]) for a, b in spans) == words(text)
    for (a, b), piece in zip(spans, pieces):
        assert words(piece) in words(text[a:b]), (piece, text[a:b])


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("text", TEXTS)
def test_the_pieces_of_every_cut_method_tile_their_text(text, method):
    for lang in ("zh", "en"):
        pieces = split_text(text, method, lang)
        if pieces:
            check(text, pieces)


def test_a_dropped_piece_goes_with_the_next_and_random_texts_tile():
    text = "One, two. ### Three, four."
    pieces = split_text(text, "cut5", "en")
    kept = [p for p in pieces if "two" not in p]  # a piece the engine drops (nothing left to read)
    check(text, kept)
    rng = random.Random(3)
    alphabet = "ab 中文,.!?。，…—\"“”()12"
    for _ in range(300):
        t = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
        for method in ("cut0", "cut1", "cut2", "cut3", "cut4", "cut5"):
            pieces = split_text(t, method, "zh") if words(t) else []
            if pieces:
                check(t, pieces)
