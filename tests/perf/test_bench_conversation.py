"""``primespeech-mlx bench --conversation`` (bench/conversation.py): the LLM stand-in's schedule, the playback
arithmetic on a synthetic timeline, the feeding, and one run end to end with the tiny fixture voice."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from conftest import fixtures_root, require_fixture

from dora_primespeech_mlx.bench import conversation as conv


def test_tokens_and_schedule():
    assert conv.tokenize("你好，世界。", "zh") == ["你", "好", "，", "世", "界", "。"]
    assert conv.tokenize("Hello, big world.", "en") == ["Hello", ",", " big", " world", "."]
    s = conv.llm_script(["你好。", "再见！"], "zh", rate=10)
    assert s.tokens == ["你", "好", "。", "再", "见", "！"]
    assert s.times == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    assert s.ends == pytest.approx([0.3, 0.6]) and s.sentences == ["你好。", "再见！"]
    en = conv.llm_script(["Hi there.", "Bye."], "en", rate=4)
    assert "".join(en.tokens) == "Hi there. Bye." and en.ends == pytest.approx([0.75, 1.25])


def test_metrics_of_a_synthetic_timeline():
    """End marks at 1.0 and 2.0 s, last token 2.5 s; chunks (arrival, duration): the first plays 1.4-1.9, the
    second arrives in time (1.9-2.4), the third 0.6 s after the player ran dry (3.0-4.0)."""
    script = conv.Script(tokens=["a", "b", "c"], times=[1.0, 2.0, 2.5], sentences=["x", "y"], ends=[1.0, 2.0])
    m = conv.metrics(script, [(1.4, 0.5), (1.8, 0.5), (3.0, 1.0)])
    assert m["first_audio"] == pytest.approx(0.4)
    assert m["gap_total"] == pytest.approx(0.6) and m["gap_worst"] == pytest.approx(0.6) and m["gaps"] == 1
    assert m["last_audio"] == pytest.approx(0.5) and m["playback_end"] == pytest.approx(1.5)
    assert m["audio_s"] == pytest.approx(2.0) and m["chunks"] == 3
    gaps, end = conv.playback([(0.0, 1.0), (0.5, 1.0), (4.0, 0.5), (4.1, 0.2)])
    assert gaps == pytest.approx([0.0, 2.0, 0.0]) and end == pytest.approx(4.7)
    with pytest.raises(ValueError):
        conv.metrics(script, [])


@pytest.mark.parametrize("fragments", [True, False], ids=["fragments", "sentences"])
def test_feed_follows_the_schedule(fragments):
    script = conv.llm_script(["你好。", "再见！"], "zh", rate=200)
    sent = []
    t0 = time.perf_counter()
    conv.feed(script, lambda text, meta: sent.append((time.perf_counter() - t0, text, meta)), fragments, t0)
    if fragments:
        assert [t for _, t, _ in sent] == script.tokens
        assert [m["seq"] for _, _, m in sent] == list(range(6)) and [m["fin"] for _, _, m in sent][-2:] == [False, True]
        due = script.times
    else:
        assert [t for _, t, _ in sent] == script.sentences
        due = script.ends
    assert all(at >= d - 1e-3 for (at, _, _), d in zip(sent, due))  # never before the LLM wrote it


def test_summary_table_and_sides(tmp_path):
    rows = [{"side": "ours:a", "lang": "zh", "rate": 20.0, "fed": "sentences", **dict.fromkeys(conv.METRICS, v)}
            for v in (1.0, 3.0, 2.0)]
    s = conv.summarize(rows)
    assert s[("ours:a", "zh", 20.0)]["first_audio"] == 2.0 and s[("ours:a", "zh", 20.0)]["runs"] == 3
    text = conv.table(s, {"upstream": "not run: why"})
    assert "| ours:a | zh | 20 | sentences | 3 | 2.00 |" in text and "- upstream: not run: why" in text
    args = SimpleNamespace(langs="zh", rates="20", sentences=3, ref_big=str(tmp_path), tiny=None,
                           ours=[str(tmp_path)], upstream=sys.executable, compare_tools=None, split="cut0")
    sides = conv.side_commands(args)
    assert sides[f"ours:{tmp_path.name}"].startswith("not run: no dora_primespeech_mlx package")
    assert sides["upstream"].startswith("not run")


@pytest.mark.parametrize("language, family", [("en", "en"), ("zh", "zh"), ("all_zh", "zh"), ("auto", "en")])
def test_the_fixture_voice_speaks_the_answers_of_its_language_family(language, family):
    """``--tiny`` with a fixture voice whose language is an option such as ``all_zh`` (not a key of the answers)."""
    assert conv.tiny_langs(["zh", "en"], language) == [family]
    assert conv.tiny_langs(["en"], language) == [family]
    assert all(lang in conv.ANSWERS for lang in conv.tiny_langs(["zh", "en"], language))


def test_conversation_end_to_end_with_the_tiny_voice(tmp_path):
    """The whole tool (orchestrator, a side process, the node's handler and engine) on the fixture voice; the side
    process's temporary model directory (gigabytes with the real-size set) is gone when it ends."""
    require_fixture("models/cases.json")
    cmd = [sys.executable, "-m", "dora_primespeech_mlx.cli", "bench", "--conversation", "--tiny", str(fixtures_root()),
           "--threads", "1", "--rates", "60", "--sentences", "3", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not list(tmp_path.glob("conversation-*")), "a side left its model directory behind"
    out = json.loads(proc.stdout)
    assert not out["not_run"], out["not_run"]
    (row,) = out["rows"]
    assert row["sentences"] == 3 and row["rate"] == 60 and row["fed"] in ("fragments", "sentences")
    assert row["chunks"] >= 3 and row["audio_s"] > 0
    assert all(math.isfinite(row[m]) for m in conv.METRICS)
    assert row["gap_total"] >= row["gap_worst"] >= 0 and row["playback_end"] >= row["last_audio"]
