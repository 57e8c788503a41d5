"""RSS while per-request voices cycle (issue 10, item 3; a script, not a unit test).

The real engine behind the real handler (no dora), a model directory with N voices built from the fixture
models (each with its own copy of the GPT and SoVITS files, so each voice loads its own models), and R
requests ``VOICE:<name>|text`` cycling over them. Prints RSS after the start voice is loaded and after every
tenth request, the cached voices and models, with the default PRIMESPEECH_VOICE_CACHE (2) or ``--cache``.

    python tests/soak/voice_cycle.py [--voices 8] [--requests 100] [--cache 2]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[0]), str(HERE.parents[0] / "node")]

import conftest  # noqa: E402,F401  (offline NLTK / text data from ../shared)
from test_faults import Recorder, _variant  # noqa: E402
from tiny_voice import checkpoint, make_model_dir, reference_wav  # noqa: E402

from dora_primespeech_mlx.dataflow.handler import MessageHandler  # noqa: E402
from dora_primespeech_mlx.dataflow.transport import DirectTransport  # noqa: E402
from dora_primespeech_mlx.node import engine_factory  # noqa: E402
from dora_primespeech_mlx.settings import Settings  # noqa: E402


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--voices", type=int, default=8)
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--cache", type=int, default=2)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="voice-cycle-"))
    root = make_model_dir(work / "models")
    names = []
    for i in range(args.voices):
        own = {k: shutil.copy(checkpoint(k), work / f"{k}{i}{checkpoint(k).suffix}") for k in ("gpt", "sovits")}
        names.append(_variant(root, f"Cycle{i}", **own, reference=reference_wav()))
    settings = Settings.from_env({"VOICE_NAME": "Tiny", "PRIMESPEECH_MODEL_DIR": str(root), "GPTSVITS_WARMUP": "false",
                                  "PRIMESPEECH_VOICE_CACHE": str(args.cache), "LOG_LEVEL": "WARNING"})
    rec = Recorder()
    handler = MessageHandler(settings, engine_factory(settings), DirectTransport(rec))
    handler.start()
    handler.ready.wait(600)
    engine = handler.engine
    print(f"{args.voices} voices, {args.requests} requests, PRIMESPEECH_VOICE_CACHE={args.cache}")
    print(f"  after start: RSS {rss_mb():7.1f} MB")
    t0 = time.perf_counter()
    for i in range(args.requests):
        handler.on_input("text", pa.array([f"VOICE:{names[i % len(names)]}|Hello world, a short test."]), {"i": i})
        handler.wait_idle(600)
        if (i + 1) % 10 == 0:
            st = engine.stats()
            models = len(st["loaded_models"])
            print(f"  after {i + 1:4d}: RSS {rss_mb():7.1f} MB, cached voices {len(st['cached_voices'])}, "
                  f"loaded models {models}")
    handler.finish(60)
    done = [o for o, _ in rec.completes()]
    print(f"  answers: {len(done)} ({done.count('completed')} completed) in {time.perf_counter() - t0:.1f} s")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
