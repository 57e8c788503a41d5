"""How many CPU threads the engine uses, decided from what the machine offers now: :class:`ThreadPlan`.

One plan per engine, built from the settings with the engine's :class:`~.runtime.Runtime` and handed down with it
(``runtime.threads``): the float16 kernels' pool, the vocoder's cut into parts, the vocoder lane's hold and the BLAS
all follow it. It counts the CPUs of the affinity mask, the cores other processes kept busy over the last second
(``/proc/stat``, read by :class:`Probe`'s sampler, less this process's own CPU time; else the load average) and CPU
pressure (``/proc/pressure/cpu``), and
uses ``floor(free + 0.3)`` threads, at least 1, at most ``PRIMESPEECH_THREADS`` (:func:`cap_for`);
``PRIMESPEECH_THREAD_PLAN=fixed`` uses the cap as it is. The engine looks again at the start of each request
(:meth:`ThreadPlan.refresh`); while the vocoder lane works the kernels and the BLAS keep to one thread. The BLAS
count is process-wide by nature (``_blas``): the plan sets it, only when its count changes. docs/performance.md,
"Threads: what the machine offers now"."""

from __future__ import annotations

import collections
import math
import os
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MODES = ("adapt", "fixed")
SMALL_MACHINE_CPUS = 2  # PRIMESPEECH_THREADS=auto: one thread on machines with at most this many CPUs
FIRST_WINDOW_S = 0.2  # the first look samples /proc/stat over this long
MIN_WINDOW_S = 0.05  # a later look sooner than this after the one before keeps the decision
FREE_ROUNDING = 0.3  # a core counts when at least 70 % of it is free
RECENT_S = 1.0  # a look measures the cores' use over about this long before it
SAMPLE_PERIOD_S = 0.25  # the background sampler reads /proc/stat this often
RING = 64  # readings kept
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system (idle iowait) irq softirq steal; guest time is within user


@dataclass(frozen=True)
class MachineView:
    """What the machine offers: ``cpus`` in the affinity mask, ``others`` cores' worth busy with other processes
    (None: unknown), CPU pressure ``some avg10`` in percent (None: no PSI), the 1-minute load average."""

    cpus: int
    others: float | None
    pressure: float | None = None
    loadavg: float | None = None
    source: str = "/proc/stat"

    def free_cores(self) -> float:
        free = float(self.cpus) - (self.others or 0.0)
        if self.pressure is not None:
            free = min(free, self.cpus * (1.0 - self.pressure / 100.0))
        return max(0.0, free)


def parse_stat(text: str, cpus: set[int] | None) -> tuple[float, float] | None:
    """(busy, total) jiffies over the ``cpuN`` lines of ``cpus`` (None: the aggregate ``cpu`` line), or None."""
    busy = total = 0.0
    seen = False
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu"):
            continue
        if cpus is None and name != "cpu" or cpus is not None and (name == "cpu" or int(name[3:]) not in cpus):
            continue
        values = [float(v) for v in rest.split()[:8]]
        values += [0.0] * (8 - len(values))
        busy += sum(values[i] for i in _BUSY_FIELDS)
        total += sum(values)
        seen = True
    return (busy, total) if seen else None


def parse_pressure(text: str) -> float | None:
    """``some avg10`` (percent) of a ``/proc/pressure/cpu`` text, or None."""
    for line in text.splitlines():
        if line.startswith("some "):
            for item in line.split()[1:]:
                key, _, value = item.partition("=")
                if key == "avg10":
                    try:
                        return float(value)
                    except ValueError:
                        return None
    return None


class Probe:
    """Reads the machine: each :meth:`look` measures from the previous reading (the first one waits ``window``).
    ``proc`` (a folder laid out like ``/proc``), ``affinity``, ``own_cpu`` (this process's CPU seconds), ``clock``,
    ``sleep`` and ``loadavg`` are there for tests."""

    def __init__(self, proc: str | os.PathLike = "/proc", affinity: Callable[[], set[int]] | None = None,
                 own_cpu: Callable[[], float] = time.process_time, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, loadavg: Callable[[], tuple] | None = None,
                 ticks: float | None = None, background: bool = True):
        self.proc = Path(proc)
        self.affinity = affinity or _affinity
        self.own_cpu, self.clock, self.sleep = own_cpu, clock, sleep
        self.loadavg = loadavg or _loadavg
        self.ticks = ticks or _ticks()
        self.background = background
        self._ring: collections.deque = collections.deque(maxlen=RING)  # (wall, CPUs, busy jiffies, own CPU s)
        self._ring_lock = threading.Lock()
        self._sampler: threading.Thread | None = None

    def _read(self, name: str) -> str | None:
        try:
            return (self.proc / name).read_text()
        except OSError:
            return None

    def record(self, cpus: set[int] | None = None) -> tuple | None:
        """Read ``/proc/stat`` now into the recent readings (the background sampler calls this every
        :data:`SAMPLE_PERIOD_S`); the reading, or None where it cannot be read."""
        cpus = frozenset(self.affinity() if cpus is None else cpus)
        text = self._read("stat")
        got = parse_stat(text, set(cpus)) if text else None
        if got is None:
            return None
        reading = (self.clock(), cpus, got[0], self.own_cpu())
        with self._ring_lock:
            self._ring.append(reading)
        return reading

    def start(self) -> None:
        """Start the background sampler (once; a daemon thread that ends with this probe): :meth:`look` then
        measures the last :data:`RECENT_S` without waiting, however long ago the previous look was."""
        if not self.background or self._sampler is not None:
            return
        ref = weakref.ref(self)

        def sample() -> None:
            while (probe := ref()) is not None:
                probe.record()
                del probe
                time.sleep(SAMPLE_PERIOD_S)
        self._sampler = threading.Thread(target=sample, name="primespeech-cpu-probe", daemon=True)
        self._sampler.start()

    def _before(self, now: tuple) -> tuple | None:
        """The reading to measure from: the newest at least :data:`RECENT_S` before ``now``, else the oldest at
        least :data:`MIN_WINDOW_S` before it (same CPUs)."""
        with self._ring_lock:
            ring = [r for r in self._ring if r[1] == now[1] and r[0] <= now[0] - MIN_WINDOW_S]
        old = [r for r in ring if r[0] <= now[0] - RECENT_S]
        return old[-1] if old else ring[0] if ring else None

    def look(self, window: float = FIRST_WINDOW_S) -> MachineView:
        """What the machine offers: the cores other processes kept busy over the last :data:`RECENT_S` (or since
        the oldest reading; the first look ever waits ``window``), the pressure and the load average."""
        cpus = self.affinity()
        n = max(1, len(cpus))
        text = self._read("pressure/cpu")
        pressure = parse_pressure(text) if text else None
        load = self.loadavg()
        with self._ring_lock:
            first = not self._ring
        if first and self.record(cpus) is not None:
            self.sleep(window)
        now = self.record(cpus)
        before = None if now is None else self._before(now)
        if now is None or before is None:
            others = None if load is None else min(float(n), float(load[0]))
            return MachineView(n, others, pressure, None if load is None else load[0], "loadavg")
        wall = now[0] - before[0]
        busy_s = (now[2] - before[2]) / self.ticks
        own_s = now[3] - before[3]
        others = min(float(n), max(0.0, (busy_s - own_s) / wall))
        return MachineView(n, others, pressure, None if load is None else load[0])


def _affinity() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def _loadavg() -> tuple | None:
    try:
        return os.getloadavg()
    except (AttributeError, OSError):
        return None


def _ticks() -> float:
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (AttributeError, ValueError, OSError):
        return 100.0


def cap_for(threads: int | str, cpus: int) -> int:
    """The most threads: ``threads`` (a number), or for ``auto`` 1 on machines with at most
    :data:`SMALL_MACHINE_CPUS` CPUs (spinning BLAS threads collapse beside a busy neighbour), else every CPU."""
    if threads != "auto":
        return max(1, int(threads))
    return 1 if cpus <= SMALL_MACHINE_CPUS else max(1, cpus)


def decide(cap: int, view: MachineView | None, mode: str = "adapt") -> tuple[int, str]:
    """(threads, why) for a cap and what the machine offers."""
    if mode == "fixed" or view is None:
        return cap, f"{cap} (PRIMESPEECH_THREAD_PLAN=fixed)" if mode == "fixed" else f"{cap} (no reading)"
    free = view.free_cores()
    n = max(1, min(cap, int(math.floor(free + FREE_ROUNDING))))
    parts = [f"{view.cpus} CPUs"]
    if view.others is not None:
        parts.append(f"{view.others:.2f} busy with others ({view.source})")
    if view.pressure is not None:
        parts.append(f"CPU pressure {view.pressure:.1f} %")
    return n, f"{n} of at most {cap}: {', '.join(parts)}, {free:.2f} free"


class ThreadPlan:
    """The engine's thread counts (see the module docstring). ``threads`` / ``mode`` / ``user_blas``: the
    settings ``PRIMESPEECH_THREADS``, ``PRIMESPEECH_THREAD_PLAN`` and whether ``OPENBLAS_NUM_THREADS`` /
    ``MKL_NUM_THREADS`` are set (then the BLAS keeps the library's own count); ``probe`` reads the machine;
    ``set_blas`` and ``hold_blas``: see :meth:`reach_blas`."""

    def __init__(self, threads: int | str = "auto", mode: str = "adapt", user_blas: bool = False,
                 probe: Probe | None = None, set_blas: Callable[[int], object] | None = None,
                 hold_blas: Callable[[bool], None] | None = None):
        if mode not in MODES:
            raise ValueError(f"thread plan {mode!r}: expected one of {', '.join(MODES)}")
        self.threads_setting, self.mode, self.user_blas = threads, mode, user_blas
        self.probe = probe if probe is not None else Probe()
        self._set_blas, self._hold_blas = set_blas, hold_blas
        self._lock = threading.Lock()
        self._busy = False  # the vocoder lane works
        self._count: int | None = None  # decided, lane idle
        self._blas_count: int | None = None  # last count handed to the BLAS
        self._when = -math.inf
        self.view: MachineView | None = None
        self.reason = "not decided yet"

    @classmethod
    def from_settings(cls, settings, **kwargs) -> ThreadPlan:
        return cls(settings.threads, getattr(settings, "thread_plan", "adapt"),
                   bool(getattr(settings, "user_blas_threads", None)), **kwargs)

    @property
    def cap(self) -> int:
        return cap_for(self.threads_setting, len(self.probe.affinity()) or 1)

    def refresh(self, force: bool = False) -> int:
        """Look at the machine (unless the last look was under :data:`MIN_WINDOW_S` ago) and decide; the BLAS
        follows where the count changed and the lane is idle. Returns the count."""
        with self._lock:
            now = self.probe.clock()
            if self._count is not None and not force and now - self._when < MIN_WINDOW_S:
                return self._count
            cap = self.cap
            if self.mode == "fixed":
                self.view = None
            else:
                self.view = self.probe.look()
                self.probe.start()  # from now on the next look measures the last second, without waiting
            self._count, self.reason = decide(cap, self.view, self.mode)
            self._when = now
            if not self._busy:
                self._apply_blas(self._count)
            return self._count

    def compute(self) -> int:
        """Threads for the caller's work (BLAS, kernels) with the lane idle (decided at the first call)."""
        return self._count if self._count is not None else self.refresh()

    def kernel_threads(self) -> int:
        """The float16 kernels' threads now: 1 while the lane works, else :meth:`compute`."""
        return 1 if self._busy else self.compute()

    def vocoder_parts_now(self) -> int:
        """How many parts a vocoder cut into parts may run at once now."""
        return self.compute()

    def vocoder_threads(self) -> int:
        """ONNX Runtime's intra-op threads when a voice loads (the cap: the parts follow the plan per call)."""
        return self.cap

    def lane(self, busy: bool, hold_blas: bool = True) -> None:
        """The vocoder lane starts (True) or stops (False) working: the kernels (and, ``hold_blas``, the BLAS) keep
        to one thread meanwhile."""
        with self._lock:
            if busy == self._busy:
                return
            self._busy = busy
            if hold_blas and not self.user_blas and self._hold_blas is not None:
                self._hold_blas(busy)
            if not busy and self._count is not None:  # a count decided while the lane worked
                self._apply_blas(self._count)

    def _apply_blas(self, n: int) -> None:
        if self.user_blas or n == self._blas_count or self._set_blas is None:
            return
        self._blas_count = n
        self._set_blas(n)

    def reach_blas(self, set_blas: Callable[[int], object], hold_blas: Callable[[bool], None]) -> ThreadPlan:
        """The process's BLAS: ``set_blas(n)`` sets its count, ``hold_blas(busy)`` keeps it to one thread while the
        lane works (the engine passes ``_blas.configure_threads`` and ``_blas.hold_one_thread``). Without them the
        plan leaves the BLAS alone."""
        with self._lock:
            self._set_blas, self._hold_blas = set_blas, hold_blas
        return self

    def describe(self) -> dict:
        return {"mode": self.mode, "cap": self.cap, "threads": self._count, "lane_busy": self._busy,
                "reason": self.reason, "view": None if self.view is None else dict(self.view.__dict__)}
