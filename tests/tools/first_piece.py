"""A stream's first audio and gaps at given settings, the engine alone, idle or beside a co-tenant.

    python tests/tools/first_piece.py [--threads 1] [--rounds 3] [--cotenant loop:threads=1]
        [--set PRIMESPEECH_STREAM_MAX_WAIT=1.0 ...] [--override stream_vocoder_margin=8 ...]

One engine on the compare tools' real-size set (``--models``, default ``$REF_BIG`` or
``~/.cache/primespeech-ref/ref-big``; ``../shared/tools/compare/README.md`` sets it up) with the conversation bench's
settings (``bench/conversation.py`` ``side_settings``; ``--set`` adds node settings, ``--override`` engine overrides
per request). Each round streams the first two sentences of the bench's Chinese and English answers as one request
(``engine.synthesize_stream``: the later sentence is known from the start) after one unmeasured request per language;
with ``--cotenant`` the co-tenant (``bench/cotenant.py``) starts after those. A player starts each chunk on arrival or
after the one before it. Prints per language the medians of the first audio (from the call) and of the gap total,
and each round's gap count. Not a test: the figures behind docs/streaming.md ("The vocoder margin").
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's package

from dora_primespeech_mlx import _blas  # noqa: E402  (the BLAS before MLX)

_blas.preload()
REF_BIG = "~/.cache/primespeech-ref/ref-big"


def _pairs(items: list[str]) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in items)


def main() -> int:
    from dora_primespeech_mlx.bench import cotenant
    from dora_primespeech_mlx.bench.conversation import ANSWERS, OursSide, playback
    from dora_primespeech_mlx.settings import Settings

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=os.environ.get("REF_BIG") or os.path.expanduser(REF_BIG))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cotenant", help="a co-tenant SPEC (bench/cotenant.py), started after the warm-up")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a node setting")
    ap.add_argument("--override", action="append", default=[], metavar="FIELD=INT", help="an engine override")
    a = ap.parse_args()
    overrides = {k: int(v) for k, v in _pairs(a.override).items()}
    text_data = Settings.from_env().text_data  # this process's front-end data, as the bench hands it to a side
    extra = {"PRIMESPEECH_TEXT_DATA": str(text_data)} if text_data else {}
    side = OursSide(a.models, None, a.threads, "cut0", {**extra, **_pairs(a.set)})  # the conversation bench's engine
    engine, voice = side.engine, side.voice

    def stream(lang: str) -> tuple[float, list[float]]:
        text = ("" if lang == "zh" else " ").join(ANSWERS[lang][:2])
        t0 = time.perf_counter()
        chunks = [(time.perf_counter() - t0, c.duration) for c in
                  engine.synthesize_stream(text, voice, text_lang=lang, **overrides)]
        return chunks[0][0], playback(chunks)[0]

    for lang in ("zh", "en"):
        stream(lang)
    running = None
    if a.cotenant:
        running, why = cotenant.started(cotenant.parse(a.cotenant))
        if running is None:
            raise SystemExit(f"the co-tenant did not start: {why}")
    try:
        results = {"zh": [], "en": []}
        for _ in range(a.rounds):
            for lang in results:
                results[lang].append(stream(lang))
    finally:
        if running is not None:
            running.stop()
    for lang, runs in results.items():
        print(f"{lang}: first audio {statistics.median(f for f, _ in runs):.3f} s, gap total "
              f"{statistics.median(sum(g) for _, g in runs):.3f} s, "
              f"gaps per round {[sum(x > 0 for x in g) for _, g in runs]}"
              f" ({a.threads} thread(s), {a.cotenant or 'idle'}, {a.set + a.override})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
