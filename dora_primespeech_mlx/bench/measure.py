"""Measurement helpers of the bench: load average, RSS, repeated timings, memory bandwidth."""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time
from typing import Any

import numpy as np


def loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _proc_status() -> dict[str, int]:
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key, value = line.split(":", 1)
                    out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def rss_mb() -> float:
    """Current resident set size (MB); falls back to the peak where /proc is missing."""
    st = _proc_status()
    if "VmRSS" in st:
        return st["VmRSS"] / 2**20
    return peak_rss_mb()


def peak_rss_mb() -> float:
    st = _proc_status()
    if "VmHWM" in st:
        return st["VmHWM"] / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def _summary(samples: list[float], unit: str, **extra) -> dict[str, Any]:
    return {
        "min": min(samples),
        "median": statistics.median(samples),
        "n": len(samples),
        "unit": unit,
        "loadavg": loadavg(),
        **extra,
    }


def timed(fn, repeat: int, warmup: int = 1) -> list[float]:
    """Seconds per call of ``fn`` (which must evaluate its result) after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def measure_bandwidth(mb: int = 256, repeat: int = 5) -> dict[str, float]:
    """Main-memory read bandwidth (GB/s): a numpy gemv over a ``mb`` MB float32 matrix (all BLAS
    threads; what a decode step can reach) and a single-threaded sum, best of ``repeat``."""
    n = int(mb * 2**20 / 4 / 4096)
    a = np.random.default_rng(0).standard_normal((n, 4096), dtype=np.float32)
    v = np.ones(4096, dtype=np.float32)
    gemv = min(timed(lambda: a @ v, repeat))
    total = min(timed(lambda: np.add.reduce(a, axis=None), repeat))
    return {"gemv_gb_s": a.nbytes / gemv / 1e9, "sum_gb_s": a.nbytes / total / 1e9, "bytes": a.nbytes}


def bench_runtime(**levers):
    """The runtime the bench measures: the settings' (``PRIMESPEECH_*`` from the environment, read here, at the
    bench's entry), with ``levers`` (:class:`~..runtime.Runtime` fields) applied."""
    from ..runtime import Runtime
    from ..settings import Settings

    return Runtime.from_settings(Settings.from_env(), **levers)


def bench_text_data():
    """The text front end's folders and g2pW choice the bench uses: the settings' (``PRIMESPEECH_TEXT_DATA``,
    ``PRIMESPEECH_MODEL_DIR``, ``PRIMESPEECH_G2PW``), read here, at the bench's entry."""
    from ..settings import Settings
    from ..text.options import TextData

    return TextData.from_settings(Settings.from_env())


def _preload_blas() -> None:
    """The fast CBLAS before mlx loads: without it the bench would measure MLX on the netlib reference BLAS
    (docs/performance.md, "The BLAS under MLX")."""
    from .. import _blas

    _blas.preload()
