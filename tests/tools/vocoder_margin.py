"""How much the vocoder margin (``stream_vocoder_margin``) changes streamed audio, on the real-size set.

    python tests/tools/vocoder_margin.py [--margins 8,6,5,4,3,0]

One engine on the compare tools' real-size set (``--models``, default ``$REF_BIG`` or
``~/.cache/primespeech-ref/ref-big``), one thread. Per language, the second sentence of the conversation bench's
answer, greedy (``top_k`` 1, seed 1), streamed in fixed steps (``stream_pace`` off: the same windows for every
margin): the relative L2 of the whole request against the streamed one with the whole receptive field (what
streaming itself changes), then of each margin's stream against that. Not a test: the table in docs/streaming.md
("The vocoder margin"); tests/engine/test_engine_stream.py checks the default on the fixture voice.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's package

from dora_primespeech_mlx import _blas  # noqa: E402  (the BLAS before MLX)

_blas.preload()
REF_BIG = "~/.cache/primespeech-ref/ref-big"


def relative(a: np.ndarray, b: np.ndarray) -> float:
    n = min(len(a), len(b))
    return float(np.linalg.norm(a[:n] - b[:n]) / np.linalg.norm(b[:n]))


def main() -> int:
    from dora_primespeech_mlx.bench.conversation import ANSWERS, OursSide
    from dora_primespeech_mlx.settings import Settings

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=os.environ.get("REF_BIG") or os.path.expanduser(REF_BIG))
    ap.add_argument("--margins", default="8,6,5,4,3,0")
    a = ap.parse_args()
    text_data = Settings.from_env().text_data  # this process's front-end data, as the bench hands it to a side
    extra = {"PRIMESPEECH_TEXT_DATA": str(text_data)} if text_data else {}
    side = OursSide(a.models, None, 1, "cut0", {"STREAMING": "false", **extra})  # the conversation bench's engine
    engine, voice = side.engine, side.voice
    for lang in ("zh", "en"):
        text, kw = ANSWERS[lang][1], {"text_lang": lang, "top_k": 1, "seed": 1}

        def streamed(margin: int, text=text, kw=kw) -> np.ndarray:
            return np.concatenate([c.audio for c in engine.synthesize_stream(
                text, voice, stream_vocoder_margin=margin, stream_pace=False, **kw)])

        exact = streamed(4096)
        whole = engine.synthesize(text, voice, **kw).audio
        margins = " ".join(f"{m}: {relative(streamed(int(m)), exact):.2g}" for m in a.margins.split(","))
        print(f"{lang}: streamed vs whole {relative(exact, whole):.2g}; margin vs whole receptive field {margins}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
