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
    assert set(stages) == {"imports_s", "front_ends_s", "voice_s", "reference", "warmup_s", "ready_s", "total_s",
                           "first_audio_s", "text_at_start"}
    assert list(stages["front_ends_s"]) == languages_for(spec.language)  # each front end the voice reaches
    parts = stages["imports_s"] + sum(stages["front_ends_s"].values()) + stages["voice_s"] + stages["warmup_s"]
    assert 0 < parts <= stages["ready_s"] + 0.05
    assert stages["ready_s"] < stages["first_audio_s"], "the first text's first audio comes after the start"
    assert stages["reference"] == "computed"  # (the tests keep the reference cache off: tests/conftest.py)
    line = describe(stages)
    assert line.startswith("start-up (fresh process, nothing queued): imports ") and "voice " in line
    assert "warm-up " in line and "ready " in line and "first audio " in line
    for lang in stages["front_ends_s"]:
        assert f"{lang} front end " in line


def test_a_text_at_the_start_skips_the_warmup_synthesis(tmp_path):
    root = make_model_dir(tmp_path / "models")
    spec = resolve_voice(VOICE, root)
    stages = startup_probe(root, time.perf_counter(), spec, text_at_start=True)
    assert stages["text_at_start"] and stages["ready_s"] < stages["first_audio_s"]
    assert "a text sent at the start" in describe(stages)
    both = describe({"idle": {**stages, "text_at_start": False}, "text_at_start": stages}).splitlines()
    assert len(both) == 2 and "nothing queued" in both[0] and "a text sent at the start" in both[1]


def test_the_stages_idle_and_beside_a_cotenant_from_one_run(tmp_path):
    """``bench --startup --cotenant SPEC``: the pair of fresh starts idle, then beside the co-tenant, which writes
    tokens through both starts of its pair; each load with its heading in the printed lines."""
    from dora_primespeech_mlx.bench.cotenant import parse
    from dora_primespeech_mlx.bench.startup import startup_loads

    root = make_model_dir(tmp_path / "models")
    spec = parse("loop:threads=1,mb=8,dim=512,rate=50")
    got = startup_loads(root, [spec], voice=VOICE)["loads"]
    assert list(got) == ["idle", spec.text]
    for load, pair in got.items():
        assert set(pair) >= {"idle", "text_at_start"}, load
        for key, stages in (("idle", pair["idle"]), ("text_at_start", pair["text_at_start"])):
            assert stages["text_at_start"] == (key == "text_at_start")
            assert 0 < stages["ready_s"] < stages["first_audio_s"], (load, key)
    figures = got[spec.text]["cotenant"]
    both = got[spec.text]["idle"]["first_audio_s"] + got[spec.text]["text_at_start"]["first_audio_s"]
    assert figures["kind"] == "loop" and figures["seconds"] >= both * 0.9  # it ran through both starts
    assert figures["tokens"] >= 1 and "cotenant" not in got["idle"]
    lines = describe({"loads": got}).splitlines()
    assert lines[0] == "idle:" and lines[3].startswith(f"beside the co-tenant {spec.text}, ")
    assert "tokens/s:" in lines[3] and len(lines) == 6
    assert all(line.startswith("  start-up (fresh process, ") for line in lines[1:3] + lines[4:6])
