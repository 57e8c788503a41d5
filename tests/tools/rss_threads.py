"""The engine's RSS under the current settings: the bench voice loaded, after three requests (two whole, one
streamed) and after the end-of-request trim, and the peak (MB).

``PRIMESPEECH_THREADS=2 PRIMESPEECH_VOCODER_PARTS=1|auto python tests/tools/rss_threads.py`` (one fresh process per
setting; the bench's real-size random-weight models, written once by ``primespeech-mlx bench``). Prints one
``RSS {json}`` line. Not a test."""

from __future__ import annotations

import json
import os

from dora_primespeech_mlx.bench.measure import _preload_blas, peak_rss_mb, rss_mb

_preload_blas()

from dora_primespeech_mlx.bench.weights import TARGET_TEXT, bench_voice, default_models_dir, ensure_models  # noqa: E402
from dora_primespeech_mlx.engine import GPTSoVITSEngine  # noqa: E402
from dora_primespeech_mlx.engine.store import trim_after_request  # noqa: E402

root = ensure_models(default_models_dir())
spec = bench_voice(root)
engine = GPTSoVITSEngine(model_dir=root)
engine.load_voice(spec)
out = {"threads": os.environ.get("PRIMESPEECH_THREADS"), "vocoder_parts": os.environ.get("PRIMESPEECH_VOCODER_PARTS"),
       "loaded_mb": rss_mb()}
opts = {"text_split_method": "cut0", "seed": 1}
for _ in range(2):
    engine.synthesize(TARGET_TEXT, voice=spec, **opts)
for _ in engine.synthesize_stream(TARGET_TEXT, voice=spec, **opts):
    pass
out["after_requests_mb"] = rss_mb()
trim_after_request()
out["after_trim_mb"] = rss_mb()
out["peak_mb"] = peak_rss_mb()
out["vocoder"] = engine.stats()["backends"]["sovits"].get("split")
print("RSS " + json.dumps({k: round(v) if isinstance(v, float) else v for k, v in out.items()}))
