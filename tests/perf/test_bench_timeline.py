"""``bench --timeline``: stage intervals from every thread, per-thread CPU folded into stage groups and rows."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from dora_primespeech_mlx.bench import timeline as tl
from dora_primespeech_mlx.engine import stats

linux = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="the sampler reads /proc (Linux)")


def test_stages_are_recorded_with_their_thread_only_while_recording():
    with stats.stage("before"):
        pass
    seen = {}

    def worker():
        seen["tid"] = threading.get_native_id()
        with stats.stage("sovits", stats.Timer(), key="sovits_stream"):
            time.sleep(0.01)

    with stats.recording_spans() as spans:
        with stats.stage("gpt"):
            time.sleep(0.01)
        th = threading.Thread(target=worker)
        th.start()
        th.join()
    with stats.stage("after"):
        pass
    assert [s[0] for s in spans] == ["gpt", "sovits_stream"]
    assert spans[0][1] == threading.get_native_id() and spans[1][1] == seen["tid"]
    assert all(e - s >= 0.009 for _n, _t, s, e in spans)


def test_analyse_folds_samples_into_stage_groups_threads_and_rows():
    # two threads over 0.4 s: thread 1 busy throughout, thread 2 only in the second half; thread 9 is the sampler
    rows = []
    for k in range(9):
        t = k * 0.05
        rows.append((t, {1: int(t * 1e9), 2: int(max(0.0, t - 0.2) * 1e9), 9: int(t * 1e9)}, t * 1.5, 0.0))
    spans = [("gpt", 1, 0.0, 0.2), ("sovits", 2, 0.2, 0.4)]
    r = tl.analyse(rows, spans, {1: "MainThread", 2: "lane"}, 0.0, 0.4, skip={9}, bucket=0.1)
    assert r["cpu_s"] == pytest.approx(0.6)
    assert r["cores"] == pytest.approx(1.5)
    assert r["others_cores"] == pytest.approx(0.0)
    assert set(r["groups"]) == {"gpt", "sovits"}
    assert r["groups"]["gpt"]["wall_s"] == pytest.approx(0.2)
    assert r["groups"]["gpt"]["cores"] == pytest.approx(1.0)
    assert r["groups"]["sovits"]["cores"] == pytest.approx(2.0)
    assert r["groups"]["sovits"]["threads"] == pytest.approx({"MainThread": 0.2, "lane": 0.2})
    assert r["threads"] == pytest.approx({"MainThread": 0.4, "lane": 0.2})
    assert [b["stages"] for b in r["buckets"]] == ["gpt", "gpt", "sovits", "sovits"]
    assert [b["cores"] for b in r["buckets"]] == pytest.approx([1.0, 1.0, 2.0, 2.0])
    late = [(t, {**ns, 3: int(max(0.0, t - 0.3) * 1e9)} if t > 0.3 else ns, b, s) for t, ns, b, s in rows]
    assert tl.analyse(late, spans, {}, 0.0, 0.4, skip={9}, bucket=0.1)["threads"]["3"] == pytest.approx(0.1)
    text = tl.report({2: {"whole": r, "stream": {**r, "first_audio_s": 0.25}}}, "x")
    assert "2 thread(s), whole: 0.40 s wall, 0.60 core-s, 1.50 cores busy" in text
    assert "first audio at 0.25 s" in text
    assert tl.report({1: {"error": "rc 1: boom"}}, "x").endswith("1 thread(s): error: rc 1: boom")


@linux
def test_the_sampler_sees_a_busy_thread_inside_its_stage():
    import hashlib

    done, leave = threading.Event(), threading.Event()
    data = b"x" * (1 << 20)

    used = {}

    def burn(seconds):
        c0 = time.thread_time()
        with stats.stage("burn"):
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                hashlib.sha256(data).digest()  # (hashing releases the GIL: the sampler keeps its pace)
        used["cpu_s"] = time.thread_time() - c0
        done.set()
        leave.wait(5)  # alive until sampled after its work (a thread's time is read while it exists)

    sampler = tl.Sampler(period=0.01)
    sampler.start()
    time.sleep(0.05)
    with stats.recording_spans() as spans:
        t0 = time.perf_counter()
        th = threading.Thread(target=burn, args=(0.4,), name="burner")
        th.start()
        done.wait(5)
        time.sleep(0.2)  # nothing running: the process idles
        t1 = time.perf_counter()
    sampler.stop()
    leave.set()
    th.join()
    r = tl.analyse(sampler.rows, spans, sampler.names, t0, t1, skip={sampler.native_id})
    burn_group = r["groups"]["burn"]
    assert next(iter(burn_group["threads"])) == "burner", burn_group
    # the burner's own CPU clock: all of it is found, in its stage (whatever a busy machine leaves it)
    assert r["threads"]["burner"] == pytest.approx(used["cpu_s"], rel=0.1, abs=0.02)
    assert burn_group["threads"]["burner"] >= 0.8 * used["cpu_s"]
    assert r["groups"]["(no stage)"]["cpu_s"] < 0.25 * burn_group["cpu_s"] + 0.02
    assert "timeline-sampler" not in r["threads"]


def test_timeline_refuses_without_proc(monkeypatch, capsys):
    monkeypatch.setattr(tl.os.path, "isdir", lambda p: False)
    import argparse

    assert tl.run_timeline(argparse.Namespace()) == 2
    assert "Linux only" in capsys.readouterr().err


def test_the_cli_offers_the_timeline():
    import subprocess

    out = subprocess.run([sys.executable, "-m", "dora_primespeech_mlx.cli", "bench", "--help"], capture_output=True,
                         text=True, check=True).stdout
    assert "--timeline" in out
