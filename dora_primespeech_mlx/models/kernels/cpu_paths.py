"""Which product path each CPU stage takes with float16 weights, per kernel build, and why.

The float16-weight kernels (``half_gemv``) halve the bytes read per weight; whether that wins depends on the
stage and the CPU. The decode step (one row, memory-bound) gains on AVX2 and AVX-512; a product of many rows
(the GPT prefill: ~200 rows; RoBERTa: ~25 tokens) is bound by arithmetic, where BLAS ``sgemm`` on the weight
upcast to float32 can beat the float16 GEMM, on one thread: on several, BLAS's spinning threads lose most of
their speed when a neighbour process holds a core, and the kernels' pool does not. :data:`DEFAULTS` holds the
faster path per (build, stage, one or several threads), each measured alternately in one process
(``python tests/models/bench_cpu_paths.py``; the figures: docs/performance.md, "CPU paths per instruction set");
where two CPUs of a build disagree, the path that loses least on the other. A fixed table, not a calibration at
load, because a timing taken at load on a busy machine picks at random. ``PRIMESPEECH_GPT_PREFILL`` /
``PRIMESPEECH_BERT_GEMM`` force a path; :func:`path` takes the runtime; :func:`chosen` reports every stage's path
and reason (``primespeech-mlx bench`` prints it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ... import _blas
from ...runtime import DEFAULT
from . import half_gemv

if TYPE_CHECKING:
    from ...runtime import Runtime

STAGES = ("gpt_prefill", "bert")
SETTINGS = {"gpt_prefill": "PRIMESPEECH_GPT_PREFILL", "bert": "PRIMESPEECH_BERT_GEMM"}
PATHS = ("float16", "float32")

# (build, stage, several threads) -> (path, why). Several threads: the kernels' pool keeps its speed beside busy
# neighbours, BLAS's spinning threads do not (issue 15; below).
DEFAULTS: dict[tuple[str, str, bool], tuple[str, str]] = {
    ("avx512", "gpt_prefill", False): ("float16", "avx512: float16 GEMM 469-540 ms vs BLAS on upcast weights "
                                                  "555-613 ms (2-core Xeon VM, 3 runs)"),
    ("avx512", "gpt_prefill", True): ("float16", "avx512, 2 threads: float16 GEMM 464 ms vs BLAS 1181 ms beside "
                                                 "busy neighbours (2 idle cores: 438 vs 443 ms; 4-16 threads: "
                                                 "float16 as fast or faster)"),
    ("avx512", "bert", False): ("float16", "avx512: float16 GEMM 182 ms vs float32 MLX 393 ms"),
    ("avx512", "bert", True): ("float16", "avx512, 2 threads: float16 GEMM 193 ms vs float32 MLX 1173 ms"),
    ("avx2", "gpt_prefill", False): ("float32", "avx2: BLAS on upcast weights 569 ms vs float16 GEMM 722 ms "
                                                "(CPU time)"),
    ("avx2", "gpt_prefill", True): ("float16", "avx2, 2 threads: float16 GEMM 3.1 s vs BLAS on upcast weights "
                                               "11.7 s beside busy neighbours"),
    ("avx2", "bert", False): ("float16", "avx2: float16 GEMM 223 ms vs float32 MLX 411 ms, BLAS on upcast weights "
                                         "457 ms (CPU time)"),
    ("avx2", "bert", True): ("float16", "avx2, 2 threads: float16 GEMM 0.79 s vs float32 MLX 9.9 s beside busy "
                                        "neighbours"),
    ("generic", "gpt_prefill", False): ("float32", "generic: the portable GEMM is untuned; BLAS on upcast weights"),
    ("generic", "gpt_prefill", True): ("float32", "generic: the portable GEMM is untuned; BLAS on upcast weights"),
    ("generic", "bert", False): ("float32", "generic: the portable GEMM is untuned; BLAS on upcast weights"),
    ("generic", "bert", True): ("float32", "generic: the portable GEMM is untuned; BLAS on upcast weights"),
}

FIELDS = {"gpt_prefill": "gpt_prefill", "bert": "bert_gemm"}  # stage -> the runtime's field forcing its path


def path(stage: str, runtime: Runtime = DEFAULT) -> tuple[str, str]:
    """(path, why) of a stage whose weights are float16 and run through the kernels: ``float16`` or ``float32``
    (forced by the runtime's ``gpt_prefill`` / ``bert_gemm``, else the default for its kernel build)."""
    if stage not in STAGES:
        raise ValueError(f"stage {stage!r}: expected one of {', '.join(STAGES)}")
    asked = getattr(runtime, FIELDS[stage])
    if asked != "auto":
        return asked, f"{SETTINGS[stage]}={asked}"
    isa = half_gemv.isa(runtime.isa)
    return DEFAULTS.get((isa, stage, several_blas_threads()), ("float32", f"{isa}: no float16 kernels"))


def several_blas_threads() -> bool:
    """Whether BLAS (the float32 path's products) runs on more than one thread (PRIMESPEECH_THREADS, or the library
    default on machines with more than two CPUs)."""
    n = _blas.thread_settings().get("blas_threads")
    return not (isinstance(n, int) and n <= 1)


def chosen(runtime: Runtime = DEFAULT, gpt_half: bool | None = None,
           bert_half: bool | None = None) -> dict[str, tuple[str, str]]:
    """Every CPU stage's path and why under ``runtime``: ``gpt_decode``, ``gpt_prefill``, ``bert`` -> (path,
    reason). ``gpt_half`` / ``bert_half``: whether the loaded models hold float16 weights (None: as far as the
    kernels and the runtime allow). On a GPU every stage is MLX's (float32 compute) and the kernels are not used."""
    import mlx.core as mx

    if mx.default_device().type != mx.cpu:
        why = f"MLX on {mx.default_device()}: the CPU kernels are not used"
        return {stage: ("mlx", why) for stage in ("gpt_decode", "gpt_prefill", "bert")}
    status = half_gemv.library_status(runtime.isa)
    build = f"{status['isa']} build ({status['isa_reason']})"
    out: dict[str, tuple[str, str]] = {}
    kernel = half_gemv.kernel(runtime.isa, runtime.gpt_half)
    if kernel is None or gpt_half is False:
        why = half_gemv.status(runtime.isa, runtime.gpt_half)["why_not"] or "the GPT's weights are not float16 values"
        out["gpt_decode"] = ("float32", why)
        out["gpt_prefill"] = ("float32", why)
    else:
        out["gpt_decode"] = ("float16", f"{build}: one-row products are memory-bound, float16 halves the bytes "
                                         "(AVX2 EPYC: 14.0 vs 23.8 ms/step)")
        out["gpt_prefill"] = path("gpt_prefill", runtime)
    if status["kernel"] and bert_half is not False:
        p, why = path("bert", runtime)
        out["bert"] = (f"{p} (float16 weights, numpy)", why)
    else:
        out["bert"] = ("float32 (MLX)", status["why_not"] or "PRIMESPEECH_BERT_HALF=0 or weights not float16 values")
    return out
