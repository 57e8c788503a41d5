"""Give MLX a fast CBLAS on Linux before ``mlx`` is imported.

The ``mlx[cpu]`` Linux wheel links the netlib *reference* BLAS, many times slower than a tuned one (docs/performance.md,
"The BLAS under MLX"). Symbols bind when ``libmlx.so`` is loaded, and a library already loaded with ``RTLD_GLOBAL``
wins, so loading a fast ``cblas_sgemm`` first fixes it. :func:`preload` does it (candidates in :func:`_attempts`;
``PRIMESPEECH_BLAS`` overrides) when the engine or the models package is first imported; :func:`report` self-checks the
choice with a timed matmul, and a warning says when MLX keeps its reference BLAS. :func:`configure_threads` runs the
BLAS single-threaded on machines with at most two usable CPUs, where spinning BLAS threads collapse beside a busy
neighbour."""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import sys
import threading
from pathlib import Path

from .errors import ConfigError
from .native import compile_shared
from .settings import process_setting

log = logging.getLogger(__name__)

_STATE: dict[str, str | None] = {"name": None, "path": None, "error": None}
_THREADS: dict[str, object] = {}
_HOLD: dict[str, object] = {"lock": threading.Lock(), "held": False}  # hold_one_thread's state
SMALL_MACHINE_CPUS = 2

def _has_symbol(lib: ctypes.CDLL, name: str) -> bool:
    try:
        getattr(lib, name)
        return True
    except AttributeError:
        return False


def _load_global(path: str) -> ctypes.CDLL:
    return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


def _mkl_candidates() -> list[str]:
    out = []
    for prefix in {sys.prefix, sys.base_prefix}:
        out += sorted(glob.glob(os.path.join(prefix, "lib", "libmkl_rt.so*")))
    return out


def _system_openblas() -> list[str]:
    pats = [
        "/usr/lib/*-linux-gnu/openblas-pthread/libblas.so.3",
        "/usr/lib/*-linux-gnu/libopenblas.so.0",
        "/usr/lib64/libopenblas.so.0",
        "/usr/lib/libopenblas.so.0",
    ]
    return [p for pat in pats for p in sorted(glob.glob(pat))]


def _numpy_openblas() -> str | None:
    try:
        import numpy
    except ImportError:
        return None
    libs = Path(numpy.__file__).resolve().parent.parent / "numpy.libs"
    hits = sorted(libs.glob("libscipy_openblas64_*.so*"))
    return str(hits[0]) if hits else None


def _build_shim(openblas: str) -> str:
    return compile_shared("blas_shim", [], [openblas, f"-Wl,-rpath,{Path(openblas).parent}"])


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _wanted_threads() -> tuple[int | None, str]:
    """(BLAS threads to use or None = library default, why)."""
    value = process_setting("threads")
    if value != "auto":
        return int(value), "PRIMESPEECH_THREADS"
    if process_setting("user_blas_threads"):
        return None, "OPENBLAS_NUM_THREADS / MKL_NUM_THREADS set by the user"
    cpus = usable_cpus()
    if cpus <= SMALL_MACHINE_CPUS:
        return 1, f"{cpus} usable CPUs (single-threaded BLAS is robust to busy neighbours)"
    return None, f"{cpus} usable CPUs (library default)"


def _runtime_setters() -> list[tuple[str, object]]:
    """Thread-count setters of the BLAS libraries loaded in this process (numpy's and ours)."""
    setters = []
    libs = []
    ob = _numpy_openblas()
    if ob:
        libs.append(("numpy-openblas", ob))
    if _STATE["path"]:
        libs.append((_STATE["name"] or "blas", _STATE["path"]))
    for tag, path in libs:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for sym in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads",
                    "MKL_Set_Num_Threads"):
            if _has_symbol(lib, sym):
                fn = getattr(lib, sym)
                fn.argtypes = [ctypes.c_int]
                fn.restype = None
                setters.append((f"{tag}:{sym}", fn))
                break
    return setters


def _apply_threads(n: int) -> list[str]:
    """Set ``n`` threads through every loaded library's setter; the setters that took it."""
    applied = []
    for tag, fn in _runtime_setters():
        try:
            fn(n)
            applied.append(tag)
        except Exception as exc:  # a foreign library: report, never fail the import or a synthesis
            log.debug("cannot set BLAS threads with %s: %s", tag, exc)
    return applied


def configure_threads(threads: int | None = None) -> dict[str, object]:
    """Set the BLAS thread count: ``threads`` or the automatic choice, through the loaded libraries' setters.
    Returns what was done (also in :func:`thread_settings`).

    On a machine with at most two usable CPUs the BLAS runs single-threaded: spinning BLAS threads collapse as soon
    as a neighbour process takes a core (docs/performance.md, "The BLAS under MLX"). ``PRIMESPEECH_THREADS`` (a
    number, or ``auto``) overrides; explicit ``OPENBLAS_NUM_THREADS`` / ``MKL_NUM_THREADS`` settings are respected.
    No environment variable of the process is changed."""
    if threads is not None:
        n, why = int(threads), "explicit"
    else:
        n, why = _wanted_threads()
    with _HOLD["lock"]:  # (not while hold_one_thread changes the count; a count set now replaces a hold)
        applied = _apply_threads(n) if n is not None else []
        _HOLD["held"] = False
        _THREADS.clear()
        _THREADS.update({"blas_threads": n if n is not None else "default", "reason": why, "applied": applied,
                         "usable_cpus": usable_cpus()})
    return dict(_THREADS)


def thread_settings() -> dict[str, object]:
    return dict(_THREADS)


def hold_one_thread(hold: bool) -> None:
    """While another thread pool works beside this process's BLAS calls (the engine's vocoder lane), the BLAS keeps
    to one thread (``hold`` True); False: back to :func:`configure_threads`' count. Spinning BLAS threads beside
    busy ones collapse: on the 2-core VM a stream window's text encoder and flow take several times longer beside the
    lane's ONNX Runtime vocoder with two BLAS threads than with one (``tests/tools/beside_lane.py``; docs/streaming.md,
    "The vocoder beside the GPT"). A BLAS call already running keeps its threads; the next one takes the count.
    Nothing happens where the BLAS runs one thread anyway."""
    with _HOLD["lock"]:
        n = _THREADS.get("blas_threads")
        if n == 1 or hold == _HOLD["held"]:
            return
        _apply_threads(1 if hold else (n if isinstance(n, int) and n > 0 else usable_cpus()))
        _HOLD["held"] = hold


def preload() -> str | None:
    """Load a fast CBLAS into the global symbol scope and set the BLAS threads. Returns the BLAS's
    name, or None. Idempotent.

    Nothing happens at import of this module: the engine and the models package call this before either loads MLX.
    Too late when the application imported ``mlx`` first (Python binds an extension's symbols when it loads it):
    then nothing is loaded and the warning names the library to put in ``LD_PRELOAD`` (or: import this package
    first). A ``cblas_sgemm`` already in the global scope (``LD_PRELOAD``) is used as it is
    (``info()["name"] == "preloaded"``)."""
    if _STATE["name"] is not None or _STATE["error"] is not None:
        return _STATE["name"]
    try:
        return _preload()
    finally:
        try:
            configure_threads()
        except ConfigError as exc:
            log.warning("%s; keeping the BLAS default threads", exc)


def _preload() -> str | None:
    if not sys.platform.startswith("linux"):
        _STATE["name"] = "native"  # macOS: Accelerate; nothing to do
        return _STATE["name"]
    choice = str(process_setting("blas")).strip() or "auto"
    if choice.lower() in {"off", "0", "false", "none"}:
        _STATE["error"] = "disabled by PRIMESPEECH_BLAS"
        return None
    if _global_cblas():  # one is in the process's global scope already (LD_PRELOAD): MLX binds to it
        where = process_setting("preloaded_libraries") or "the global symbol scope"
        _STATE["name"], _STATE["path"] = "preloaded", where
        return _STATE["name"]
    late = "mlx.core" in sys.modules  # libmlx's symbols are bound: loading one now would change nothing
    errors = []
    for name, path in _attempts(choice):
        try:
            lib = _resolve(name, path, load=not late)
            if not _has_symbol(lib, "cblas_sgemm"):
                raise RuntimeError(f"{lib._name} does not export cblas_sgemm")
        except (OSError, RuntimeError) as exc:
            errors.append(f"{name}: {exc}")
            continue
        if late:
            _STATE["error"] = (
                "mlx was imported before dora_primespeech_mlx, so MLX keeps the reference BLAS its Linux wheel links: "
                "its matrix products are ~30x slower (on the CPU the SoVITS stages before the vocoder ~20x). Import "
                f"dora_primespeech_mlx before mlx, or start the process with LD_PRELOAD={lib._name}")
            _STATE["path"] = lib._name  # what LD_PRELOAD should name
            log.warning(_STATE["error"])
            return None
        _STATE["name"], _STATE["path"] = name, lib._name
        return name
    _STATE["error"] = "; ".join(errors) or "no candidate"
    if late:
        _STATE["error"] = f"mlx was imported before dora_primespeech_mlx (no fast BLAS found either: {_STATE['error']})"
        log.warning(_STATE["error"])
    return None


def _global_cblas() -> bool:
    """Whether ``cblas_sgemm`` is already in the global symbol scope (a library in ``LD_PRELOAD``, or loaded with
    ``RTLD_GLOBAL``): MLX's reference-BLAS symbols then resolve to it. The libraries Python loads (libmlx's own
    BLAS among them) are local to their importer and never answer this lookup."""
    try:
        return _has_symbol(ctypes.CDLL(None), "cblas_sgemm")
    except OSError:
        return False


def _attempts(choice: str) -> list[tuple[str, str | None]]:
    """The candidates in order: ``PRIMESPEECH_BLAS``'s path (or ``off``), else

    1. pip ``mkl`` (``<prefix>/lib/libmkl_rt.so.*``), when installed;
    2. a system OpenBLAS (Debian ``libopenblas0-pthread``);
    3. numpy's own bundled OpenBLAS (``scipy_openblas64_``), whose symbols are prefixed and 64-bit: a
       ten-line C shim that forwards ``cblas_sgemm``/``cblas_dgemm`` to it is compiled once with the system C
       compiler (the same one ``mx.compile`` needs) into a per-user cache."""
    if choice.lower() != "auto":
        return [("custom", choice)]
    return ([("mkl", p) for p in _mkl_candidates()] + [("openblas-system", p) for p in _system_openblas()]
            + [("openblas-numpy", None)])


def _resolve(name: str, path: str | None, load: bool) -> ctypes.CDLL:
    """The library of one candidate (numpy's OpenBLAS through the shim, built once), loaded into the global scope
    when ``load``, else only opened (to name it and check its symbols)."""
    if name == "openblas-numpy":
        ob = _numpy_openblas()
        if ob is None:
            raise RuntimeError("numpy has no bundled scipy_openblas64_")
        if load:
            _load_global(ob)
        path = _build_shim(ob)
    return _load_global(str(path)) if load else ctypes.CDLL(str(path))


def info() -> dict[str, str | None]:
    """Which BLAS MLX uses on this machine (for stats, logs and the benchmark)."""
    return dict(_STATE)


def report(size: int = 256) -> dict[str, object]:
    """Self-check: time one float32 matmul on the CPU (reference BLAS: ~6 ms at 256; a fast one: <1 ms)."""
    import time

    import mlx.core as mx

    a = mx.random.normal((size, size))
    mx.eval(a @ a)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        mx.eval(a @ a)
        best = min(best, time.perf_counter() - t)
    out = dict(_STATE)
    out["matmul_ms"] = round(best * 1e3, 3)
    out["fast"] = best * 1e3 < 2.0 * (size / 256) ** 3
    return out
