"""``primespeech-mlx bench --conversation`` (bench/conversation.py): the LLM stand-in's schedule, the playback
arithmetic on a synthetic timeline, the feeding, and one run end to end with the tiny fixture voice."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import fixtures_root, require_fixture

from dora_primespeech_mlx.bench import conversation as conv
from dora_primespeech_mlx.bench import cotenant


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
    assert s[("ours:a", "idle", "zh", 20.0)]["first_audio"] == 2.0 and s[("ours:a", "idle", "zh", 20.0)]["runs"] == 3
    text = conv.table(s, {"upstream": "not run: why"})
    assert "| ours:a | idle | – | zh | 20 | sentences | 3 | 2.00 |" in text and "- upstream: not run: why" in text
    beside = [dict(r, load="loop:rate=48", cotenant_tps=t, first_audio=5.0) for r, t in zip(rows, (40.0, 44.0, 47.0))]
    s = conv.summarize(rows + beside)
    assert s[("ours:a", "loop:rate=48", "zh", 20.0)]["cotenant_tps"] == 44.0
    assert s[("ours:a", "idle", "zh", 20.0)]["cotenant_tps"] is None
    lines = conv.table(s, {}).splitlines()
    assert lines[2].startswith("| ours:a | idle | – | zh | 20 |")  # the idle row, then the co-tenant's beside it
    assert lines[3].startswith("| ours:a | loop:rate=48 | 44.0 | zh | 20 | sentences | 3 | 5.00 |")
    args = SimpleNamespace(langs="zh", rates="20", sentences=3, ref_big=str(tmp_path), tiny=None,
                           ours=[str(tmp_path)], upstream=sys.executable, compare_tools=None, split="cut0")
    sides = conv.side_commands(args)
    assert sides[f"ours:{tmp_path.name}"].startswith("not run: no dora_primespeech_mlx package")
    assert sides["upstream"].startswith("not run")


def test_cotenant_specs():
    s = cotenant.parse("loop")
    assert s.kind == "loop" and s.options == {"threads": 1, "mb": 400.0, "rate": 48.0, "dim": 2048}
    s = cotenant.parse("loop:threads=2,mb=50,rate=0")
    assert (s.threads, s.options["mb"], s.options["rate"], s.text) == (2, 50.0, 0.0, "loop:threads=2,mb=50,rate=0")
    assert cotenant.parse("llama:threads=1,shape=qwen2.5-1.5b").options["quant"] == "q8_0"
    for bad in ("gpu", "loop:rate=fast", "loop:size=3", "loop:threads=0", "loop:mb=-1", "llama:shape=qwen3",
                "loop:threads"):
        with pytest.raises(ValueError):
            cotenant.parse(bad)


def test_cotenant_loop_runs_at_most_its_rate_and_stops():
    """The loop process writes tokens from READY to the end of its standard input, never faster than its rate."""
    c = cotenant.Cotenant(cotenant.parse("loop:threads=1,mb=8,dim=512,rate=50"))
    c.start(timeout=120)
    time.sleep(1.0)
    got = c.stop()
    assert c.proc.returncode == 0
    assert got["kind"] == "loop" and got["tokens"] >= 1 and got["seconds"] >= 0.9
    assert got["tokens"] <= 50 * got["seconds"] + 1  # paced: token i no earlier than i / rate
    assert got["tokens_per_s"] == pytest.approx(got["tokens"] / got["seconds"], rel=0.02)
    with pytest.raises(RuntimeError, match="did not start"):  # a co-tenant that cannot run says why
        cotenant.Cotenant(cotenant.parse("llama:python=/bin/false")).start(timeout=30)


def _llama_python() -> str | None:
    """An interpreter with llama-cpp-python and gguf (the extra ``llm``): this one, or ``$LLAMA_PYTHON``."""
    import importlib.util

    if importlib.util.find_spec("llama_cpp") and importlib.util.find_spec("gguf"):
        return sys.executable
    return os.environ.get("LLAMA_PYTHON")


def test_cotenant_llama_writes_a_random_qwen_and_decodes(tmp_path):
    """The llama co-tenant: a GGUF of random weights in a Qwen2 shape written with the gguf package, loaded by
    llama.cpp, decoding tokens until stopped."""
    python = _llama_python()
    if python is None:
        pytest.skip("no llama-cpp-python here (pip install '.[llm]', or LLAMA_PYTHON=an interpreter that has it)")
    model = tmp_path / "tiny.gguf"
    c = cotenant.Cotenant(cotenant.parse(f"llama:shape=tiny,quant=f16,rate=40,model={model},python={python}"))
    c.start(timeout=300)
    time.sleep(1.0)
    got = c.stop()
    assert model.is_file() and got["kind"] == "llama" and got["tokens"] >= 1
    assert got["tokens"] <= 40 * got["seconds"] + 1


@pytest.mark.parametrize("language, family", [("en", "en"), ("zh", "zh"), ("all_zh", "zh"), ("auto", "en")])
def test_the_fixture_voice_speaks_the_answers_of_its_language_family(language, family):
    """``--tiny`` with a fixture voice whose language is an option such as ``all_zh`` (not a key of the answers)."""
    assert conv.tiny_langs(["zh", "en"], language) == [family]
    assert conv.tiny_langs(["en"], language) == [family]
    assert all(lang in conv.ANSWERS for lang in conv.tiny_langs(["zh", "en"], language))


def test_conversation_end_to_end_with_the_tiny_voice(tmp_path):
    """The whole tool (orchestrator, a side process, the node's handler and engine) on the fixture voice, idle and
    beside a loop co-tenant in one run, at the --threads given; the side process's temporary model directory
    (gigabytes with the real-size set) is gone when it ends."""
    require_fixture("models/cases.json")
    cmd = [sys.executable, "-m", "dora_primespeech_mlx.cli", "bench", "--conversation", "--tiny", str(fixtures_root()),
           "--threads", "2", "--rates", "60", "--sentences", "3", "--json", "--cotenant", "loop:mb=20,dim=512,rate=40",
           "--ours", f"{Path(__file__).resolve().parents[2]}@PRIMESPEECH_THREAD_PLAN=fixed"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not list(tmp_path.glob("conversation-*")), "a side left its model directory behind"
    out = json.loads(proc.stdout)
    assert not out["not_run"], out["not_run"]
    idle, beside = sorted(out["rows"], key=lambda r: r["load"] != "idle")
    assert idle["load"] == "idle" and idle["cotenant_tps"] is None
    assert beside["load"] == "loop:mb=20,dim=512,rate=40" and beside["cotenant"]["kind"] == "loop"
    # the co-tenant ran through the measured run (started before it, stopped after) and wrote tokens
    measured = conv.llm_script(conv.ANSWERS[beside["lang"]][:3], beside["lang"], 60).times[-1] + beside["last_audio"]
    assert beside["cotenant"]["seconds"] >= measured and beside["cotenant"]["tokens"] > 0
    assert 0 < beside["cotenant_tps"] <= 40 * 1.05
    for row in (idle, beside):
        assert row["sentences"] == 3 and row["rate"] == 60 and row["fed"] in ("fragments", "sentences")
        assert row["chunks"] >= 3 and row["audio_s"] > 0
        assert all(math.isfinite(row[m]) for m in conv.METRICS)
        assert row["gap_total"] >= row["gap_worst"] >= 0 and row["playback_end"] >= row["last_audio"]
        # the thread plan's decision: --threads reaches the side's settings (its table, not the environment)
        assert row["threads_used"] == 2 and "fixed" in row["threads_why"], row["threads_why"]


def test_dora_player_figures_count_from_the_send_times():
    """The player's figures (bench/conversation_dora.py) are conversation.metrics of the writer's send stamps and
    the audio arrivals: first audio counts from the moment the first sentence's last fragment was sent (late here,
    0.5 s after its schedule), not from its schedule; a run without audio or with a failed answer is a problem."""
    from dora_primespeech_mlx.bench import conversation_dora as cd

    script = conv.llm_script(conv.ANSWERS["en"][:2], "en", rate=10)
    ends = [script.times.index(e) for e in script.ends]
    sent = [t + (0.5 if i >= ends[0] else 0.0) for i, t in enumerate(script.times)]  # the writer ran late
    t0 = 1000.0  # monotonic seconds of the answer's start
    chunks = [(t0 + sent[ends[0]] + 0.3, 2.0, "Sure, "), (t0 + sent[ends[0]] + 1.0, 1.5, "let us see."),
              (t0 + sent[-1] + 4.0, 3.0, " A new garden.")]
    runs = [{"segment": 1, "lang": "en", "rate": 10.0, "sentences": 2, "answer": "completed", "sent": sent,
             "ends": ends, "t0": t0, "loadavg": 0.5},
            {"segment": 2, "lang": "en", "rate": 10.0, "sentences": 2, "answer": "error", "sent": sent, "ends": ends,
             "t0": t0},
            {"segment": 3, "lang": "en", "rate": 10.0, "sentences": 2, "answer": "completed", "sent": sent,
             "ends": ends, "t0": t0}]
    rows, problems = cd.figures(runs, {1: chunks, 2: chunks}, {1: 1, 2: 1, 3: 1})
    assert [r["segment"] for r in rows] == [1, 2]
    row = rows[0]
    assert row["first_audio"] == pytest.approx(0.3)  # from the send, not from the schedule (0.8 then)
    expected = conv.metrics(conv.Script([""] * len(sent), sent, script.sentences, [sent[i] for i in ends]),
                            [(at - t0, d) for at, d, _ in chunks])
    assert {k: row[k] for k in expected} == pytest.approx(expected)
    assert row["gap_total"] > 0 and row["spoken"] == "Sure, let us see. A new garden." and row["fed"] == "fragments"
    assert problems == ["segment 2 was answered 'error'", "segment 3: no audio arrived at the player"]
    _, problems = cd.figures(runs[:1], {1: chunks}, {1: 3})  # a node that answers each fragment on its own
    assert problems and "3 answers" in problems[0]


@pytest.mark.dora
def test_conversation_under_dora_run_with_the_tiny_voice(tmp_path):
    """``--dora``: the tiny fixture voice's node under a real ``dora run`` (writer node, the node, player node),
    idle and beside a loop co-tenant, next to the in-process side of the same run: every figure present and finite,
    audio for every sentence (the chunks' texts tile the answer; as many seconds of audio as in process: the same
    seed and text at one thread), the co-tenant running through the measured run; the temporary dataflow and model
    folders are gone after."""
    require_fixture("models/cases.json")
    cmd = [sys.executable, "-m", "dora_primespeech_mlx.cli", "bench", "--conversation", "--tiny", str(fixtures_root()),
           "--threads", "1", "--rates", "60", "--sentences", "3", "--json", "--dora",
           "--cotenant", "loop:mb=20,dim=512,rate=40"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not list(tmp_path.glob("conversation-*")), "a dataflow or model folder was left behind"
    out = json.loads(proc.stdout)
    assert not out["not_run"], out["not_run"]
    dora = [r for r in out["rows"] if r["mode"] == "dora run"]
    inproc = [r for r in out["rows"] if r["mode"] == "in-process"]
    assert sorted(r["load"] for r in dora) == ["idle", "loop:mb=20,dim=512,rate=40"], out["rows"]
    assert len(inproc) == 2 and all(r["side"].endswith("(dora run)") for r in dora)
    for row in dora:
        lang = row["lang"]
        assert row["sentences"] == 3 and row["rate"] == 60 and row["fed"] == "fragments"
        assert all(math.isfinite(row[m]) for m in conv.METRICS)
        assert row["first_audio"] > 0 and row["gap_total"] >= row["gap_worst"] >= 0
        assert row["last_audio"] > -1 and row["playback_end"] >= row["last_audio"]
        assert row["chunks"] >= 3 and row["audio_s"] > 0
        spoken = " ".join(row["spoken"].split())
        for sentence in conv.ANSWERS[lang][:3]:
            assert " ".join(sentence.split()) in spoken, (sentence, row["spoken"])
        twin = next(r for r in inproc if r["load"] == row["load"])
        assert row["audio_s"] == pytest.approx(twin["audio_s"], abs=1e-3)
    beside = next(r for r in dora if r["load"] != "idle")
    measured = conv.llm_script(conv.ANSWERS[beside["lang"]][:3], beside["lang"], 60).times[-1] + beside["last_audio"]
    assert beside["cotenant"]["kind"] == "loop" and beside["cotenant"]["seconds"] >= measured
    assert 0 < beside["cotenant_tps"] <= 40 * 1.05
    table = conv.table(conv.summarize(out["rows"]), {})
    assert "(dora run) | idle |" in table and "(dora run) | loop:mb=20,dim=512,rate=40 |" in table


def test_the_dora_nodes_load_no_mlx():
    """The writer and player nodes (``python -m dora_primespeech_mlx.bench.conversation_dora``) import no MLX: beside
    the node they measure they stay small."""
    code = "import sys, dora_primespeech_mlx.bench.conversation_dora; print(sorted(m for m in sys.modules if " \
           "m == 'mlx' or m.startswith('mlx.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
