"""float16-weight products with float32 accumulation on the CPU: which build of the C kernels this machine runs.

A decode step reads every block weight once per token: it is bound by memory bandwidth. The released GPT
checkpoints store their weights as float16, so keeping them in float16 loses nothing, but numpy and BLAS have no
float16 x float32 product. The kernels in ``csrc/half_gemv.c`` read the float16 weights, convert them in
registers and accumulate in float32 (the gemv of the decode step, the whole decode step's blocks in one call, a
small-M GEMM for the prefill and RoBERTa, the prefill's attention; a small thread pool whose work splits never
change a value). :class:`~.half_matrix.HalfMatrix` wraps one weight. :func:`choose_isa` lists the builds
(``PRIMESPEECH_ISA``); every function takes the build asked for and the mode as arguments: a cache of the
builds, no process-wide choice."""

from __future__ import annotations

import copy
import ctypes
import logging
import platform

import numpy as np

from ... import _blas, native

log = logging.getLogger(__name__)

ENV = "PRIMESPEECH_GPT_HALF"
ISAS = ("avx512", "avx2", "generic")  # the builds, fastest first
_X86 = platform.machine().lower() in ("x86_64", "amd64")
FLAGS = {
    "avx512": ["-O3", "-mavx2", "-mfma", "-mf16c", "-mavx512f", "-pthread"],
    "avx2": ["-O3", "-mavx2", "-mfma", "-mf16c", "-pthread"],
    # -Wno-psabi: x86-64 without -mavx warns that 32-byte vectors of static helpers change the (unused) ABI
    "generic": ["-O3", "-pthread"] + (["-Wno-psabi"] if _X86 else []),
}
NEEDS = {"avx512": ("avx512f", "avx2", "fma", "f16c"), "avx2": ("avx2", "fma", "f16c"), "generic": ()}
ASKED = ("auto", "avx512", "avx2", "generic", "none")  # the builds one may ask for
_LIBS: dict[str, dict[str, object]] = {}  # build asked for -> the library ("lib"), why not ("why"), "isa", "reason"
_WARNED: set[tuple[str, str]] = set()


def mode(value: str) -> str:
    """The GPT's float16 mode from ``PRIMESPEECH_GPT_HALF`` / the runtime's ``gpt_half``: ``auto`` (on where the
    kernel builds and the weights are exactly float16), ``on`` (``1``: also rounds other weights; a warning when
    the kernel cannot be had), ``off`` (``0``: never)."""
    m = {"1": "on", "0": "off"}.get(str(value), str(value))
    if m not in ("auto", "on", "off"):
        raise ValueError(f"gpt_half {value!r}: expected auto, 1 or 0")
    return m


def _asked(isa: str) -> str:
    if isa not in ASKED:
        raise ValueError(f"isa {isa!r}: expected one of {', '.join(ASKED)}")
    return isa


def threads() -> int:
    """The kernels' thread count without a thread plan: the package's BLAS thread count (``PRIMESPEECH_THREADS``: 1
    on machines with <= 2 usable CPUs unless set). An engine's kernels ask its plan instead (:func:`kernel`,
    :func:`library` with ``plan``: ``threads.ThreadPlan.kernel_threads``)."""
    n = _blas.thread_settings().get("blas_threads")
    return n if isinstance(n, int) and n > 0 else max(1, _blas.usable_cpus())


def cpu_flags() -> list[str] | str:
    """This CPU's flags (x86-64 Linux: /proc/cpuinfo), or why they cannot be read."""
    if not _X86:
        return f"{platform.machine()} is not x86-64"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return "cannot read /proc/cpuinfo"


def choose_isa(asked: str = "auto") -> tuple[str, str]:
    """(the build to use for ``asked``: avx512, avx2, generic or none; why).

    Builds (the runtime's ``isa``, ``PRIMESPEECH_ISA``), compiled once per process and build by
    ``native.compile_shared`` into the package's cache:

    - ``avx512``: AVX-512F tiles (16 lanes) with AVX2/FMA/F16C; where the CPU has ``avx512f``;
    - ``avx2``: AVX2 + FMA + F16C (8 lanes); where the CPU has them (also on an AVX-512 CPU, to measure it);
    - ``generic``: the portable C (compiler vector extensions and ``_Float16``; NEON on aarch64), any CPU;
    - ``none``: no kernels: numpy float32 and MLX.

    ``auto`` (the default) picks ``avx512`` or ``avx2`` by this CPU's flags, else ``none`` (other CPUs, Apple's
    included: the portable build's speed there is unmeasured, so float32 stays the default). A build the CPU
    cannot run is refused (never an illegal instruction), and every build passes a self-check against numpy before
    use. :func:`library` returns None where no kernels are to be had (then callers keep float32); :func:`kernel` is
    the library for the GPT unless its mode (``PRIMESPEECH_GPT_HALF``) is ``0``. Threads: an engine's thread plan
    (``plan``: 1 while the vocoder lane works), else :func:`threads`."""
    asked = _asked(asked)
    flags = cpu_flags()
    if asked == "none":
        return "none", "PRIMESPEECH_ISA=none"
    if asked == "generic":
        return "generic", "PRIMESPEECH_ISA=generic"
    if asked != "auto":
        if isinstance(flags, str):
            return "none", f"PRIMESPEECH_ISA={asked} but {flags}"
        missing = [f for f in NEEDS[asked] if f not in flags]
        if missing:
            return "none", f"PRIMESPEECH_ISA={asked} but this CPU lacks {', '.join(missing)}"
        return asked, f"PRIMESPEECH_ISA={asked}"
    if isinstance(flags, str):
        return "none", f"{flags}: float32 numpy / MLX (the portable build is PRIMESPEECH_ISA=generic; unmeasured)"
    for isa in ("avx512", "avx2"):
        if all(f in flags for f in NEEDS[isa]):
            return isa, f"auto: this CPU has {', '.join(NEEDS[isa])}"
    missing = [f for f in NEEDS["avx2"] if f not in flags]
    return "none", f"auto: this CPU lacks {', '.join(missing)} (float32 numpy / MLX)"


def _build(isa: str) -> str:
    return native.compile_shared("half_gemv", FLAGS[isa])


def library(asked: str = "auto", plan=None):
    """The compiled kernels (:class:`_Kernel`) of the build ``asked`` for (see :func:`choose_isa`), whatever the GPT's
    mode says, or None where they cannot be had (see :func:`library_status`). Built once per process and build;
    ``plan`` (an engine's ``threads.ThreadPlan``): the kernels on that plan's threads."""
    entry = _LIBS.get(_asked(asked))
    if entry is not None:
        return _bound(entry["lib"], plan)
    return _bound(_library(asked), plan)


def _bound(lib, plan):
    return lib if lib is None or plan is None else lib.on_threads(plan.kernel_threads)


def _library(asked: str):
    lib, why = None, None
    isa, reason = choose_isa(asked)
    if isa == "none":
        why = reason
    else:
        try:
            lib = _Kernel(ctypes.CDLL(_build(isa)), isa)
            if not _self_check(lib):
                lib, why = None, f"the {isa} build failed its self-check"
        except (OSError, RuntimeError) as exc:
            lib, why = None, f"cannot build the {isa} kernels: {exc}"
    if why and asked not in ("auto", "none"):
        log.warning("float16 kernels unavailable: %s", why)
    _LIBS[asked] = {"lib": lib, "why": why, "isa": isa if lib is not None else "none", "reason": reason}
    return lib


def library_status(asked: str = "auto") -> dict[str, object]:
    lib = library(asked)
    entry = _LIBS[asked]
    return {"kernel": lib is not None, "why_not": entry["why"], "threads": threads(),
            "isa": entry["isa"], "isa_reason": entry["reason"], "avx512": bool(lib and lib.isa == "avx512")}


def isa(asked: str = "auto") -> str:
    """The build in use for ``asked``: avx512, avx2, generic, or none (no kernels)."""
    library(asked)
    return str(_LIBS[asked]["isa"])


def kernel(asked: str = "auto", gpt_half: str = "auto", plan=None):
    """The kernels for the GPT decode (:class:`_Kernel`), or None (see :func:`status` for why): the
    :func:`library` of ``asked`` unless ``gpt_half`` (``PRIMESPEECH_GPT_HALF``) is ``0``; on ``plan``'s threads."""
    fn, why = _kernel(asked, mode(gpt_half))
    return _bound(fn, plan)


def _kernel(asked: str, m: str):
    if m == "off":
        return None, f"{ENV}=0 (off)"
    fn = library(asked)
    why = _LIBS[asked]["why"]
    if why and m == "on" and (asked, m) not in _WARNED:  # asked for explicitly: say it once
        _WARNED.add((asked, m))
        log.warning("%s=1 but float16 GPT decode weights are unavailable: %s", ENV, why)
    return fn, why


def _fn(lib, name: str, *argtypes):
    f = getattr(lib, name)
    f.argtypes = list(argtypes)
    f.restype = None
    return f


_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int


class _Kernel:
    """The compiled library: ``kernel(W, x, b, y, n, k)`` is ``gemv_f16`` on ``nthreads()`` threads (rows split,
    every result bit-identical to one thread's); ``gemm(W, X, b, Y, m, n, k, act)``; ``ffn(...)`` (the decode
    step's fc1 -> ReLU -> fc2 in one call); ``upcast(src, dst, n)``."""

    ACT = {None: 0, "relu": 1, "gelu": 2}

    def __init__(self, lib, isa: str, nthreads=None):
        self.lib, self.isa = lib, isa
        self.nthreads = nthreads or threads  # () -> the thread count for the next call
        self.avx512 = isa == "avx512"
        self.gemv1 = _fn(lib, "gemv_f16", _P, _P, _P, _P, _I64, _I64)
        self.gemv_mt = _fn(lib, "gemv_f16_mt", _P, _P, _P, _P, _I64, _I64, _INT)
        self.ffn_mt = _fn(lib, "ffn_f16_mt", _P, _P, _P, _P, _P, _P, _P, _I64, _I64, _INT)
        self.gemm_mt = _fn(lib, "gemm_f16", _P, _P, _P, _P, _I64, _I64, _I64, _INT, _INT)
        self.gemm_mt.restype = _INT
        self.upcast = _fn(lib, "f16_to_f32", _P, _P, _I64)
        self.bias_act = _fn(lib, "bias_act", _P, _P, _I64, _I64, _INT)
        self.downcast_exact = _fn(lib, "f32_to_f16_exact", _P, _P, _I64)
        self.downcast_exact.restype = _INT
        self.add_layer_norm_rows = _fn(lib, "add_layer_norm_rows", _P, _P, _P, _P, _I64, _I64, ctypes.c_float, _INT)
        self.prefill_attention = _fn(lib, "prefill_attention", _P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64,
                                     ctypes.c_float, _INT)
        self.decode_layers = _fn(lib, "decode_layers", _P, _I64, _I64, _I64, _P, _P, _I64, _I64, _I64,
                                 ctypes.c_float, ctypes.c_float, _INT)
        self.decode_layers_batch = _fn(lib, "decode_layers_batch", _P, _I64, _P, _P, _P, _P, _I64, _I64, _I64, _I64,
                                       ctypes.c_float, ctypes.c_float, _INT)
        self.decode_layers_batch.restype = _INT
        # the int8 decode step (PRIMESPEECH_PRECISION=int8, models/kernels/q8.py)
        self.gemv_q8_mt = _fn(lib, "gemv_q8_mt", _P, _P, _P, _P, _P, _I64, _I64, _INT)
        self.quantize_rows_q8 = _fn(lib, "quantize_rows_q8", _P, _P, _P, _I64, _I64)
        self.decode_layers_q8 = _fn(lib, "decode_layers_q8", _P, _I64, _I64, _I64, _P, _P, _I64, _I64, _I64,
                                    ctypes.c_float, ctypes.c_float, _INT)
        self.decode_layers_batch_q8 = _fn(lib, "decode_layers_batch_q8", _P, _I64, _P, _P, _P, _P, _I64, _I64, _I64,
                                          _I64, ctypes.c_float, ctypes.c_float, _INT)
        self.decode_layers_batch_q8.restype = _INT

    def on_threads(self, nthreads) -> _Kernel:
        """The same kernels with their thread count from ``nthreads()`` (a thread plan's ``kernel_threads``)."""
        bound = copy.copy(self)
        bound.nthreads = nthreads
        return bound

    def __call__(self, W, x, b, y, n, k) -> None:
        self.gemv_mt(W, x, b, y, n, k, self.nthreads())

    def gemm(self, W, X, b, Y, m, n, k, act: str | None = None, nthreads: int | None = None) -> None:
        if self.gemm_mt(W, X, b, Y, m, n, k, self.ACT[act], self.nthreads() if nthreads is None else nthreads):
            raise MemoryError(f"gemm_f16: no memory for the {m} x {k} rows' transposed copy and weight panels")

    def ffn(self, W1, b1, W2, b2, x, h, y, k, n1) -> None:
        self.ffn_mt(W1, b1, W2, b2, x, h, y, k, n1, self.nthreads())


def _self_check(fn) -> bool:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((7, 37)).astype(np.float16)
    x = rng.standard_normal(37).astype(np.float32)
    b = rng.standard_normal(7).astype(np.float32)
    y = np.empty(7, np.float32)
    fn(w.ctypes.data, x.ctypes.data, b.ctypes.data, y.ctypes.data, 7, 37)
    up = np.empty(w.shape, np.float32)
    fn.upcast(w.ctypes.data, up.ctypes.data, w.size)
    exact = bool(np.array_equal(up, w.astype(np.float32)))
    xs = rng.standard_normal((5, 37)).astype(np.float32)
    ys = np.empty((5, 7), np.float32)
    fn.gemm(w.ctypes.data, xs.ctypes.data, b.ctypes.data, ys.ctypes.data, 5, 7, 37, None, 1)
    ref = w.astype(np.float32) @ x + b
    return exact and bool(np.allclose(y, ref, atol=1e-4)) and bool(np.allclose(ys, xs @ w.astype(np.float32).T + b,
                                                                               atol=1e-4))


def status(asked: str = "auto", gpt_half: str = "auto") -> dict[str, object]:
    m = mode(gpt_half)
    fn, why = _kernel(asked, m)
    return {"mode": m, "kernel": fn is not None, "why_not": why, "threads": threads()}


def to_float16_exact(a: np.ndarray, fn) -> np.ndarray | None:
    """``a`` (float32) as a new float16 array when every value is a float16 value, else None (one pass, the
    kernel's conversion)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    out = np.empty(a.shape, dtype=np.float16)
    return out if fn.downcast_exact(a.ctypes.data, out.ctypes.data, a.size) else None


def __getattr__(name: str):
    if name == "HalfMatrix":  # the wrapper lives in half_matrix; the old import path keeps working
        from .half_matrix import HalfMatrix

        return HalfMatrix
    raise AttributeError(name)
