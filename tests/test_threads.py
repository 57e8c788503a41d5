"""threads.py: the thread plan decides from the affinity mask, /proc/stat and CPU pressure (fake /proc readings
here), caps at PRIMESPEECH_THREADS, keeps the kernels to one thread while the vocoder lane works, and reaches the
BLAS only when its count changes."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from dora_primespeech_mlx import threads as th

TICKS = 100.0


def stat_line(name: str, user: float, idle: float, system: float = 0, steal: float = 0, iowait: float = 0) -> str:
    # cpuN user nice system idle iowait irq softirq steal guest guest_nice
    return f"{name} {user:g} 0 {system:g} {idle:g} {iowait:g} 0 0 {steal:g} 0 0"


class FakeProc:
    """A /proc folder whose stat advances by ``busy`` cores (per CPU, in jiffies) per second of a fake clock, and
    whose own-process CPU time advances by ``own`` cores."""

    def __init__(self, tmp_path, cpus=(0, 1), busy=(0.0, 0.0), own=0.0, pressure: str | None = None):
        self.root = tmp_path / "proc"
        (self.root / "pressure").mkdir(parents=True)
        self.cpus, self.busy, self.own = list(cpus), list(busy), own
        self.now, self.own_s = 1000.0, 0.0
        self.jiffies = {c: [0.0, 0.0] for c in self.cpus}  # busy, idle
        self.pressure = pressure
        self.write()

    def write(self):
        lines = [stat_line("cpu", sum(b for b, _ in self.jiffies.values()), sum(i for _, i in self.jiffies.values()))]
        lines += [stat_line(f"cpu{c}", b, i) for c, (b, i) in self.jiffies.items()]
        (self.root / "stat").write_text("\n".join(lines) + "\nintr 1 2 3\n")
        if self.pressure is not None:
            (self.root / "pressure" / "cpu").write_text(self.pressure)

    def advance(self, seconds: float):
        self.now += seconds
        for c, frac in zip(self.cpus, self.busy):
            self.jiffies[c][0] += frac * seconds * TICKS
            self.jiffies[c][1] += (1 - frac) * seconds * TICKS
        self.own_s += self.own * seconds
        self.write()

    def probe(self, affinity=None, loadavg=(0.0, 0.0, 0.0)):
        return th.Probe(self.root, affinity=lambda: set(affinity if affinity is not None else self.cpus),
                        own_cpu=lambda: self.own_s, clock=lambda: self.now, sleep=self.advance,
                        loadavg=lambda: loadavg, ticks=TICKS, background=False)


def plan(proc: FakeProc, threads="auto", mode="adapt", **kw):
    blas, holds = [], []
    p = th.ThreadPlan(threads, mode, probe=proc.probe(**kw), set_blas=blas.append, hold_blas=holds.append)
    return p, blas, holds


def test_parse_stat_and_pressure():
    text = "\n".join([stat_line("cpu", 30, 70), stat_line("cpu0", 10, 40, steal=5, iowait=3),
                      stat_line("cpu1", 20, 30), "intr 5"])
    assert th.parse_stat(text, None) == (30, 100)
    assert th.parse_stat(text, {0}) == (15, 58)  # steal counts as busy, iowait as idle
    assert th.parse_stat(text, {0, 1}) == (35, 108)
    assert th.parse_stat(text, {7}) is None and th.parse_stat("", None) is None
    psi = "some avg10=42.50 avg60=10.00 avg300=1.00 total=123\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    assert th.parse_pressure(psi) == 42.5
    assert th.parse_pressure("full avg10=3.0\n") is None and th.parse_pressure("") is None


def test_an_idle_machine_gets_its_cap(tmp_path):
    proc = FakeProc(tmp_path, busy=(0.02, 0.03))
    p, blas, _ = plan(proc, threads=2)
    assert p.refresh() == 2 and blas == [2]
    assert p.view.others == pytest.approx(0.05) and p.view.cpus == 2 and p.view.pressure is None
    assert "2 of at most 2" in p.reason


def test_one_busy_core_leaves_one_thread(tmp_path):
    """A co-tenant keeping one of two cores busy: 2 threads are not used."""
    proc = FakeProc(tmp_path, busy=(0.95, 0.1))
    p, blas, _ = plan(proc, threads=2)
    assert p.refresh() == 1 and blas == [1] and p.kernel_threads() == 1
    assert p.view.others == pytest.approx(1.05)


def test_own_cpu_time_is_not_counted_as_a_neighbour(tmp_path):
    """Both cores busy, but one of them with this process's own work: one core is still ours."""
    proc = FakeProc(tmp_path, busy=(1.0, 1.0), own=1.0)
    p, _, _ = plan(proc, threads=2)
    assert p.refresh() == 1 and p.view.others == pytest.approx(1.0)
    proc.own = 2.0  # all of it ours
    proc.advance(1.0)
    assert p.refresh() == 2


def test_the_affinity_mask_counts_only_its_cpus(tmp_path):
    """Four CPUs, the mask holds 2 and 3; CPUs 0 and 1 are busy with others but not ours to use."""
    proc = FakeProc(tmp_path, cpus=(0, 1, 2, 3), busy=(1.0, 1.0, 0.0, 0.1))
    p, _, _ = plan(proc, threads=4, affinity={2, 3})
    assert p.refresh() == 2 and p.view.cpus == 2 and p.view.others == pytest.approx(0.1)
    assert p.cap == 4  # a number is the cap as given; the mask bounds the free cores
    p_auto, _, _ = plan(proc, threads="auto", affinity={2, 3})
    assert p_auto.cap == 1 and p_auto.refresh() == 1  # auto: two CPUs in the mask, a small machine


def test_cpu_pressure_bounds_the_free_cores(tmp_path):
    psi = "some avg10=55.00 avg60=20.00 avg300=5.00 total=1\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    proc = FakeProc(tmp_path, busy=(0.1, 0.1), pressure=psi)
    p, _, _ = plan(proc, threads=2)
    assert p.refresh() == 1 and p.view.pressure == 55.0
    assert p.view.free_cores() == pytest.approx(0.9)


def test_without_proc_stat_the_load_average_stands_in(tmp_path):
    proc = FakeProc(tmp_path)
    (proc.root / "stat").unlink()
    p, _, _ = plan(proc, threads=2, loadavg=(1.2, 1.0, 0.9))
    assert p.refresh() == 1 and p.view.source == "loadavg" and p.view.others == pytest.approx(1.2)
    p2, _, _ = plan(proc, threads=2, loadavg=(0.1, 0.1, 0.1))
    assert p2.refresh() == 2


def test_auto_cap_and_fixed_mode(tmp_path):
    assert th.cap_for("auto", 2) == 1 and th.cap_for("auto", 1) == 1 and th.cap_for("auto", 8) == 8
    assert th.cap_for(3, 2) == 3
    proc = FakeProc(tmp_path, busy=(1.0, 1.0))
    p, blas, _ = plan(proc, threads=2, mode="fixed")
    assert p.refresh() == 2 and blas == [2] and p.view is None and "fixed" in p.reason
    with pytest.raises(ValueError):
        th.ThreadPlan(2, "sometimes")


def test_each_request_looks_again_from_the_last_reading(tmp_path):
    """The first look samples a short window; later ones measure since the one before (no waiting), and the BLAS
    is told only when the count changes."""
    proc = FakeProc(tmp_path, busy=(0.0, 0.0))
    p, blas, _ = plan(proc, threads=2)
    t0 = proc.now
    assert p.refresh() == 2 and proc.now - t0 == pytest.approx(th.FIRST_WINDOW_S)
    proc.busy = [1.0, 0.0]  # a co-tenant starts
    proc.advance(3.0)
    t1 = proc.now
    assert p.refresh(force=True) == 1 and proc.now == t1  # no wait
    proc.advance(1.0)
    assert p.refresh(force=True) == 1
    proc.busy = [0.0, 0.0]
    proc.advance(2.0)
    assert p.refresh(force=True) == 2
    assert blas == [2, 1, 2]


def test_the_lane_holds_kernels_and_blas_to_one_thread(tmp_path):
    proc = FakeProc(tmp_path)
    p, blas, holds = plan(proc, threads=2)
    assert p.kernel_threads() == 2
    p.lane(True)
    p.lane(True)  # (twice: one hold)
    assert p.kernel_threads() == 1 and holds == [True]
    proc.busy = [1.0, 0.0]
    proc.advance(1.0)
    p.refresh(force=True)  # decided while the lane works: the BLAS is told after it
    assert blas == [2]
    p.lane(False)
    assert holds == [True, False] and blas == [2, 1] and p.kernel_threads() == 1
    p.lane(True, hold_blas=False)  # the runtime's hold_blas off: the kernels alone
    assert holds == [True, False] and p.kernel_threads() == 1


def test_user_blas_threads_are_left_alone(tmp_path):
    proc = FakeProc(tmp_path)
    blas, holds = [], []
    p = th.ThreadPlan(2, "adapt", user_blas=True, probe=proc.probe(), set_blas=blas.append, hold_blas=holds.append)
    p.refresh()
    p.lane(True)
    assert blas == [] and holds == [] and p.kernel_threads() == 1


def test_from_settings_and_the_runtime_carries_it():
    from dora_primespeech_mlx.runtime import Runtime
    from dora_primespeech_mlx.settings import Settings

    s = Settings.from_env({"PRIMESPEECH_THREADS": "2", "PRIMESPEECH_THREAD_PLAN": "fixed"})
    r = Runtime.from_settings(s)
    assert isinstance(r.threads, th.ThreadPlan) and r.threads.threads_setting == 2 and r.threads.mode == "fixed"
    assert r.replace(vocoder="mlx").threads is r.threads  # one plan, passed down with the runtime
    assert r.describe()["threads"]["mode"] == "fixed"
    with pytest.raises(ValueError):
        Settings.from_env({"PRIMESPEECH_THREAD_PLAN": "often"})
    p = th.ThreadPlan.from_settings(SimpleNamespace(threads="auto", thread_plan="adapt", user_blas_threads="4"))
    assert p.user_blas and p.threads_setting == "auto"


def test_kernels_bound_to_a_plan_take_its_count():
    """The float16 kernels ask the plan they were bound to, per call; unbound ones keep the process default."""
    import numpy as np

    from dora_primespeech_mlx.models.kernels import half_gemv

    lib = half_gemv.library()
    if lib is None:
        pytest.skip("float16 kernels unavailable here")
    counts = iter([1, 3, 2])
    bound = lib.on_threads(lambda: next(counts))
    seen = []
    bound.gemv_mt = lambda *a: seen.append(a[-1])  # the C entry point's last argument: the thread count
    w = np.ones((4, 8), np.float16)
    for _ in range(3):
        bound(w.ctypes.data, 0, 0, 0, 4, 8)
    assert seen == [1, 3, 2] and lib.nthreads is half_gemv.threads and bound.lib is lib.lib


def test_a_look_measures_the_last_second_however_long_ago_the_last_one_was(tmp_path):
    """After a long idle spell a co-tenant starts writing a second and a half before the next request: the look
    measures the sampler's last second, not the whole spell since the previous look."""
    proc = FakeProc(tmp_path, busy=(0.0, 0.0))
    probe = proc.probe()
    p = th.ThreadPlan(2, "adapt", probe=probe, set_blas=lambda n: None, hold_blas=lambda b: None)
    assert p.refresh() == 2
    for _ in range(120):  # 30 s idle, the sampler reading every 0.25 s
        proc.advance(th.SAMPLE_PERIOD_S)
        probe.record()
    proc.busy = [1.0, 0.05]
    for _ in range(6):
        proc.advance(th.SAMPLE_PERIOD_S)
        probe.record()
    assert p.refresh(force=True) == 1 and p.view.others == pytest.approx(1.05)
    assert len(probe._ring) <= th.RING


def test_the_sampler_thread_reads_while_the_probe_lives(tmp_path):
    proc = FakeProc(tmp_path)
    probe = th.Probe(proc.root, affinity=lambda: {0, 1}, ticks=TICKS)
    probe.start()
    probe.start()  # (once)
    deadline = time.monotonic() + 5
    while len(probe._ring) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(probe._ring) >= 2 and probe._sampler.daemon
    sampler = probe._sampler
    del probe
    sampler.join(2 * th.SAMPLE_PERIOD_S + 1)
    assert not sampler.is_alive()  # it ends with its probe
