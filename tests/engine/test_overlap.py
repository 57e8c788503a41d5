"""When the vocoder runs beside the GPT (engine/overlap.py): only on ONNX Runtime, by default only with two or
more cores for it, never with PRIMESPEECH_OVERLAP=0; and the lane returns the generator's audio in order."""

from __future__ import annotations

import functools
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from dora_primespeech_mlx.engine import overlap


def _sovits(active="onnxruntime", threads=1, parts=None):
    split = SimpleNamespace(parts=parts) if parts else None
    backend = SimpleNamespace(active=active, generator=SimpleNamespace(threads=threads), split=split)
    return SimpleNamespace(vocoder_backend=backend)


@pytest.mark.parametrize(("mode", "sovits", "expected"), [
    ("auto", _sovits(threads=1), False),
    ("auto", _sovits(threads=2), True),
    ("auto", _sovits(threads=1, parts=2), True),
    ("1", _sovits(threads=1), True),
    ("0", _sovits(threads=4), False),
    ("1", _sovits(active="mlx", threads=4), False),
    ("auto", SimpleNamespace(), False),
])
def test_wanted(mode, sovits, expected):
    assert overlap.wanted(mode, sovits) is expected


def test_default_thread_count_counts_as_every_core(monkeypatch):
    monkeypatch.setattr(overlap.os, "cpu_count", lambda: 8)
    assert overlap.wanted("auto", _sovits(threads=0)) is True
    monkeypatch.setattr(overlap.os, "cpu_count", lambda: 1)
    assert overlap.wanted("auto", _sovits(threads=0)) is False


def test_lane_runs_in_order_on_its_thread():
    seen = []

    class Backend:
        def run_onnx(self, z, ge):
            seen.append(threading.current_thread().name)
            return z[0, 0] * 2 + ge[0, 0, 0]

    lane = overlap.VocoderLane()
    try:
        futures = [lane.submit(Backend(), np.full((1, 2, 3), i, np.float32), np.ones((1, 1, 1), np.float32))
                   for i in range(5)]
        results = [f.result() for f in futures]
    finally:
        lane.close()
    assert [float(a[0]) for a, _ in results] == [2 * i + 1 for i in range(5)]
    assert all(seconds >= 0 for _, seconds in results)
    assert all(name.startswith("primespeech-vocoder") for name in seen)


def test_lane_reports_a_failed_run_as_none():
    class Failed:
        def run_onnx(self, z, ge):
            return None  # the backend's "ONNX Runtime failed: let MLX run it"

    lane = overlap.VocoderLane()
    try:
        audio, _ = lane.submit(Failed(), np.zeros((1, 1, 1)), np.zeros((1, 1, 1))).result()
    finally:
        lane.close()
    assert audio is None


def _through_a_gated_lane(on_busy, jobs: int, running, idle) -> None:
    """Runs ``jobs`` vocoder runs that wait for a gate through a lane with ``on_busy``: ``running()`` is called while
    they wait, then the gate opens; returns when ``idle()`` is true (the lane's last callback ran) or after 1 s."""
    import time

    gate = threading.Event()

    class Gated:
        def run_onnx(self, z, ge):
            gate.wait(5)
            return z

    lane = overlap.VocoderLane(on_busy=on_busy)
    try:
        futures = [lane.submit(Gated(), np.zeros((1, 1, 1)), np.zeros((1, 1, 1))) for _ in range(jobs)]
        running()
        gate.set()
        for f in futures:
            f.result()
        for _ in range(100):
            if idle():
                break
            time.sleep(0.01)
    finally:
        lane.close()


def test_on_busy_marks_the_lane_busy_until_its_last_job():
    events = []

    def running():
        assert events == [True]  # once, when work arrived at the idle lane

    _through_a_gated_lane(events.append, 3, running, lambda: len(events) == 2)
    assert events == [True, False]


@pytest.mark.parametrize("hold", [True, False])
def test_the_engine_s_lane_keeps_the_blas_to_one_thread_while_it_works(hold, monkeypatch):
    """While a vocoder run is in the lane, MLX's BLAS runs one thread (two spinning BLAS threads beside the lane's
    collapse: tests/tools/beside_lane.py); afterwards the configured count again."""
    from dora_primespeech_mlx import _blas
    from dora_primespeech_mlx.engine import core
    from dora_primespeech_mlx.threads import ThreadPlan

    calls = []
    monkeypatch.setattr(_blas, "hold_one_thread", calls.append)
    plan = ThreadPlan(2, "fixed").reach_blas(lambda n: None, _blas.hold_one_thread)  # as the engine does

    def running():
        assert calls == ([True] if hold else [])
        assert plan.kernel_threads() == 1  # the float16 kernels too, held by the engine's plan

    on_busy = functools.partial(core._lane_busy, plan, hold)  # the runtime's hold_blas
    _through_a_gated_lane(on_busy, 2, running, lambda: len(calls) == (2 if hold else 0))
    assert calls == ([True, False] if hold else [])
