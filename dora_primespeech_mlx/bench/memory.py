"""The bench's memory probes: RSS of a lean load and of a fresh engine, each in its own process, and the
vocoder memory levers one by one (``primespeech-mlx bench --memory-levers``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .measure import loadavg, peak_rss_mb, rss_mb
from .weights import TARGET_TEXT, bench_voice


def memory_probe(root: Path, bert_half: bool = False) -> dict[str, float]:
    """Load the four models through the engine's loader (``convert.load``: one tensor at a time
    straight into MLX, heap trimmed after each model) and report RSS and the process peak. Run in a
    fresh process by :func:`memory_lean` (``bert_half`` picks the RoBERTa storage)."""
    from ..convert import load
    from .measure import bench_runtime

    runtime = bench_runtime(bert_half=bert_half)
    models = [load.load_gpt(root / "gpt", runtime=runtime), load.load_sovits(root / "sovits", runtime=runtime),
              load.load_hubert(root / "hubert", runtime=runtime), load.load_bert(root / "bert", runtime=runtime)]
    out = {"rss_mb": rss_mb(), "peak_rss_mb": peak_rss_mb()}
    del models
    return out


def memory_lean(root: Path, bert_half: bool) -> dict[str, float]:
    code = (
        "import sys, json, pathlib; import dora_primespeech_mlx.bench.memory as b; "
        "print(json.dumps(b.memory_probe(pathlib.Path(sys.argv[1]), sys.argv[2] == '1')))"
    )
    args = [sys.executable, "-c", code, str(root), "1" if bert_half else "0"]
    out = subprocess.run(args, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def memory_breakdown(engine=None) -> dict[str, Any]:
    """Where the RSS goes (MB): MLX buffers in use and cached (``mx.get_active_memory`` /
    ``get_cache_memory``), each loaded model's MLX parameters, the rest (numpy arrays such as the GPT's
    float16 decode weights, the ONNX Runtime session, Python, libraries, free heap not yet returned)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    mb = 2**20
    out: dict[str, Any] = {"rss_mb": round(rss_mb(), 1), "mlx_active_mb": round(mx.get_active_memory() / mb, 1),
                           "mlx_cache_mb": round(mx.get_cache_memory() / mb, 1)}
    if engine is not None:
        for key in engine.cache.keys():
            value = engine.cache.peek(key)
            model = value[0] if isinstance(value, tuple) else value
            if hasattr(model, "parameters"):
                nbytes = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
                out[f"params_{key[0]}_mb"] = round(nbytes / mb, 1)
    out["other_mb"] = round(out["rss_mb"] - out["mlx_active_mb"] - out["mlx_cache_mb"], 1)
    return out


def memory_engine_probe(root: Path, repeat: int = 2, release_mlx: bool = True, arena: bool = False,
                        trim_reference: bool = True, decoder_at_load: bool = True) -> dict[str, Any]:
    """The engine alone in this process (run fresh by :func:`memory_engine`): RSS with the voice loaded, after
    ``repeat`` whole requests and one streamed one, and after ``store.trim_after_request`` (called at the end
    of each request by the engine), with the breakdown of :func:`memory_breakdown` and the trim's cost.
    ``release_mlx`` / ``arena`` / ``trim_reference`` / ``decoder_at_load``: the memory levers (the runtime's
    ``release_mlx``, ``vocoder_arena``, ``trim_after_reference``, ``decoder_at_load``)."""
    from ..engine import GPTSoVITSEngine
    from ..engine.store import trim_after_request
    from ..models.sovits import vocoder
    from .measure import bench_runtime

    runtime = bench_runtime(release_mlx=release_mlx, vocoder_arena=arena, trim_after_reference=trim_reference,
                            decoder_at_load=decoder_at_load)
    spec = bench_voice(root)
    engine = GPTSoVITSEngine(model_dir=root, runtime=runtime)
    engine.load_voice(spec)
    out: dict[str, Any] = {"loaded": memory_breakdown(engine), "loading_peak_rss_mb": round(peak_rss_mb(), 1)}
    opts = {"text_split_method": "cut0", "top_k": 15, "seed": 1}
    for _ in range(repeat):
        engine.synthesize(TARGET_TEXT, voice=spec, **opts)
    for _chunk in engine.synthesize_stream(TARGET_TEXT, voice=spec, **opts):
        pass
    out["after_requests"] = memory_breakdown(engine)
    t = time.perf_counter()
    trim_after_request()
    out["trim_ms"] = round((time.perf_counter() - t) * 1e3, 1)
    out["after_trim"] = memory_breakdown(engine)
    out["peak_rss_mb"] = round(peak_rss_mb(), 1)
    (sovits,) = [engine.cache.peek(k) for k in engine.cache.keys("sovits")]
    out["vocoder"] = {k: v for k, v in vocoder.status(sovits).items() if k in ("backend", "arena", "mlx_weights")}
    ((bert, _tokenizer),) = [engine.cache.peek(k) for k in engine.cache.keys("bert")]
    out["bert_dtype"] = str(bert.embeddings.word_embeddings.weight.dtype).rsplit(".", 1)[-1]
    return out


def memory_engine(root: Path, release_mlx: bool = True, arena: bool = False, trim_reference: bool = True,
                  decoder_at_load: bool = True) -> dict[str, Any]:
    """:func:`memory_engine_probe` in a fresh process."""
    code = (
        "import sys, json, pathlib; import dora_primespeech_mlx.bench as bench; "
        "import dora_primespeech_mlx.bench.memory as b; "
        "bench._preload_blas(); "
        "print(json.dumps(b.memory_engine_probe(pathlib.Path(sys.argv[1]), release_mlx=sys.argv[2] == '1', "
        "arena=sys.argv[3] == '1', trim_reference=sys.argv[4] == '1', decoder_at_load=sys.argv[5] == '1'), "
        "default=str))"
    )
    levers = (release_mlx, arena, trim_reference, decoder_at_load)
    args = [sys.executable, "-c", code, str(root), *(str(int(x)) for x in levers)]
    out = subprocess.run(args, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


MEMORY_LEVERS = (  # (label, release_mlx, arena, trim_reference, decoder_at_load): one lever added per row
    ("before", False, True, False, False),
    ("+ trim after the reference", False, True, True, False),
    ("+ GPT decode weights built at load", False, True, True, True),
    ("+ MLX generator weights dropped", True, True, True, True),
    ("+ ONNX Runtime arena off (all: default)", True, False, True, True),
)


def memory_levers(root: Path) -> str:
    """``bench --memory-levers``: the engine's RSS in a fresh process per lever setting, one after the other in
    this run (and "before" again at the end): voice loaded, after 3 requests, after the end-of-request trim
    (the last lever: its column)."""
    rows, dtypes = [], set()
    for label, *levers in (*MEMORY_LEVERS, MEMORY_LEVERS[0]):
        m = memory_engine(root, *levers)
        dtypes.add(m["bert_dtype"])
        rows.append(f"| {label} | {m['loaded']['rss_mb']:.0f} | {m['after_requests']['rss_mb']:.0f} | "
                    f"{m['after_trim']['rss_mb']:.0f} ({m['trim_ms']:.0f} ms) | {m['loading_peak_rss_mb']:.0f} | "
                    f"{m['peak_rss_mb']:.0f} | "
                    f"{m['after_trim']['mlx_active_mb']:.0f} | {m['after_trim']['other_mb']:.0f} | {loadavg()} |")
        print(rows[-1], file=sys.stderr, flush=True)
    bert = "/".join(sorted(dtypes))  # the storage the engines chose (PRIMESPEECH_BERT_HALF, auto by default)
    head = (f"engine RSS (MB), bench voice, RoBERTa {bert}, fresh process per row\n"
            "| levers | voice loaded | after 3 requests | after end-of-request trim | peak while loading | peak "
            "| MLX buffers | rest | loadavg |\n|---|---|---|---|---|---|---|---|---|")
    return "\n".join([head, *rows])
