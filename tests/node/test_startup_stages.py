"""The start-up stages ``primespeech-mlx bench`` prints (bench/startup.py), on the tiny fixture voice."""

from __future__ import annotations

import time

from tiny_voice import VOICE, make_model_dir

from dora_primespeech_mlx.assets.catalog import resolve_voice
from dora_primespeech_mlx.bench.startup import describe, startup_probe
from dora_primespeech_mlx.text.warmup import languages_for


def test_the_stages_of_a_start(tmp_path):
    root = make_model_dir(tmp_path / "models")
    spec = resolve_voice(VOICE, root)
    started = time.perf_counter()
    stages = startup_probe(root, started, spec)
    assert set(stages) == {"imports_s", "front_ends_s", "voice_s", "warmup_s", "total_s"}
    assert list(stages["front_ends_s"]) == languages_for(spec.language)  # each front end the voice reaches
    parts = stages["imports_s"] + sum(stages["front_ends_s"].values()) + stages["voice_s"] + stages["warmup_s"]
    assert 0 < parts <= stages["total_s"] + 0.05
    line = describe(stages)
    assert line.startswith("start-up (fresh process): imports ") and "voice " in line and "warm-up " in line
    for lang in stages["front_ends_s"]:
        assert f"{lang} front end " in line
