"""The bench's report: the machine it ran on, and the table printed by ``primespeech-mlx bench``."""

from __future__ import annotations

import os
import platform
from typing import Any

import numpy as np

# PyTorch upstream, 2-core AMD EPYC VM, torch 2.13, 2 threads (docs/performance.md, "The stage bench"), in ms.
UPSTREAM_MS = {
    "hubert": 648.0,
    "bert": 250.8,
    "gpt_prefill": 249.7,
    "gpt_decode_ms_per_token": 26.6,
    "sovits_s_per_audio_s": 1524.5 / 4000.0,
    "e2e_cached_reference": 5023.4,
}


TARGETS = {
    "gpt_decode_ms_per_token": 20.0,
    "gpt_decode_vs_floor": 1.3,
    "sovits_s_per_audio_s": 0.30,
    "e2e_cached_reference_ms": 2500.0,
    "time_to_first_audio_ms": 1000.0,
    "peak_rss_mb": 1500.0,
}


def environment() -> dict[str, Any]:
    import mlx.core as mx

    from .. import _blas
    from ..models.kernels.cpu_paths import chosen as chosen_paths

    blas = _blas.report()
    return {
        "mlx": getattr(mx, "__version__", "?"),
        "device": str(mx.default_device()),
        "blas": blas.get("name"),
        "blas_path": blas.get("path"),
        "blas_matmul256_ms": blas.get("matmul_ms"),
        "threads": _blas.thread_settings() if hasattr(_blas, "thread_settings") else {},
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "paths": chosen_paths(),
    }


def _fmt(entry: dict[str, Any] | None, scale: float = 1.0, digits: int = 1) -> str:
    if not entry:
        return "-"
    return f"{entry['min'] * scale:.{digits}f} / {entry['median'] * scale:.{digits}f}"


def table(report: dict[str, Any]) -> str:
    st, en, env, mem = report["stages"], report.get("engine", {}), report["environment"], report["memory"]
    bw = st.get("bandwidth", {})
    rows = [
        ("CNHubert, 5 s reference", "ms", _fmt(st.get("hubert")), UPSTREAM_MS["hubert"], None),
        ("RoBERTa, 23 tokens", "ms", _fmt(st.get("bert")), UPSTREAM_MS["bert"], None),
        ("GPT prefill (71 phones + 139 prompt)", "ms", _fmt(st.get("gpt_prefill")), UPSTREAM_MS["gpt_prefill"], None),
        ("GPT decode (100 tokens)", "ms/token", _fmt(st.get("gpt_decode"), digits=2),
         UPSTREAM_MS["gpt_decode_ms_per_token"], TARGETS["gpt_decode_ms_per_token"]),
        *[(f"  decode step alone, {name} weights", "ms/step", _fmt(st.get(f"gpt_step_{key}"), digits=2), None, None)
          for key, name in (("half", "float16"), ("fp32", "float32"), ("int8", "int8 (PRIMESPEECH_PRECISION)"))
          if f"gpt_step_{key}" in st],
        *[(f"  prefill, {name} weights", "ms", _fmt(st.get(f"gpt_prefill_{key}")), None, None)
          for key, name in (("half", "float16"), ("fp32", "float32")) if f"gpt_prefill_{key}" in st],
        *[(f"  batched step, {key[10:]} rows", "ms/token", _fmt(st[key], digits=2), None, None)
          for key in sorted(st, key=lambda k: int(k[10:]) if k[10:].isdigit() else 0) if key.startswith("gpt_batch_")],
        ("  bandwidth floor of the decode step", "ms/token",
         f"{bw['decode_floor_ms']:.2f} (x{bw['decode_vs_floor']})" if bw else "-", None,
         f"x{TARGETS['gpt_decode_vs_floor']}"),
        (f"SoVITS decode ({st.get('sovits', {}).get('backend', '-')}, the engine's)", "s per s audio",
         _fmt(st.get("sovits"), digits=3), round(UPSTREAM_MS["sovits_s_per_audio_s"], 3),
         TARGETS["sovits_s_per_audio_s"]),
        *[(f"  SoVITS with the {name} vocoder", "s per s audio", _fmt(st.get(f"sovits_{name}"), digits=3), None,
           None) for name in ("mlx", "onnxruntime", "onnxruntime_split", "onnxruntime_arena", "openvino",
                              "openvino_bf16") if f"sovits_{name}" in st],
        *[("  SoVITS openvino_bf16 (PRIMESPEECH_PRECISION=bf16) / the engine's (same run)", "ratio",
           f"{st['sovits_openvino_bf16']['min'] / st['sovits']['min']:.2f} / "
           f"{st['sovits_openvino_bf16']['median'] / st['sovits']['median']:.2f}", None, None)
          for _ in [0] if "sovits_openvino_bf16" in st and "sovits" in st],
        *[("  SoVITS openvino / onnxruntime as the engine runs it (same run)", "ratio",
           f"{st['sovits_openvino']['min'] / st[f'sovits_{ort}']['min']:.2f} / "
           f"{st['sovits_openvino']['median'] / st[f'sovits_{ort}']['median']:.2f}", None, None)
          for ort in ["onnxruntime_split" if "sovits_onnxruntime_split" in st else "onnxruntime"]
          if "sovits_openvino" in st and f"sovits_{ort}" in st],
        *[("  SoVITS onnxruntime cut per thread / whole (same run)", "ratio",
           f"{st['sovits_onnxruntime_split']['min'] / st['sovits_onnxruntime']['min']:.2f} / "
           f"{st['sovits_onnxruntime_split']['median'] / st['sovits_onnxruntime']['median']:.2f}", None, None)
          for _ in [0] if "sovits_onnxruntime_split" in st and "sovits_onnxruntime" in st],
        *[(f"  vocoder, {st[key]['sentences']} sentences {what}", "s/sentence", _fmt(st[key], digits=3), None, None)
          for key, what in (("vocoder_after_another", "one after another, all threads"),
                            ("vocoder_at_once", "at once, 1 thread each")) if key in st],
        *[("  vocoder at once / one after another (same run)", "ratio",
           f"{st['vocoder_at_once']['min'] / st['vocoder_after_another']['min']:.2f} / "
           f"{st['vocoder_at_once']['median'] / st['vocoder_after_another']['median']:.2f}", None, None)
          for _ in [0] if "vocoder_at_once" in st and "vocoder_after_another" in st],
        *[("  SoVITS onnxruntime no arena / arena", "ratio",
           f"{st['sovits_onnxruntime']['min'] / st['sovits_onnxruntime_arena']['min']:.3f} / "
           f"{st['sovits_onnxruntime']['median'] / st['sovits_onnxruntime_arena']['median']:.3f}", None, None)
          for _ in [0] if "sovits_onnxruntime" in st and "sovits_onnxruntime_arena" in st],
        *[("  SoVITS onnxruntime / mlx (same run)", "ratio",
           f"{st['sovits_onnxruntime']['min'] / st['sovits_mlx']['min']:.2f} / "
           f"{st['sovits_onnxruntime']['median'] / st['sovits_mlx']['median']:.2f}", None, None)
          for _ in [0] if "sovits_onnxruntime" in st and "sovits_mlx" in st],
        ("End to end, 20 characters, cached ref", "ms", _fmt(en.get("e2e_cached_reference"), digits=0),
         UPSTREAM_MS["e2e_cached_reference"], TARGETS["e2e_cached_reference_ms"]),
        ("Time to first audio (streaming)", "ms", _fmt(en.get("time_to_first_audio"), digits=0),
         UPSTREAM_MS["e2e_cached_reference"], TARGETS["time_to_first_audio_ms"]),
        ("Peak RSS (process)", "MB", f"{mem['peak_rss_mb']:.0f}", None, TARGETS["peak_rss_mb"]),
        ("RSS, all four models loaded", "MB", f"{mem['rss_models_loaded_mb']:.0f}", None, TARGETS["peak_rss_mb"]),
    ]
    if "rss_after_engine_mb" in en:
        rows.append(("RSS after the engine run (this process)", "MB", f"{en['rss_after_engine_mb']:.0f}", None,
                     TARGETS["peak_rss_mb"]))
    fresh = mem.get("engine_fresh_process", {})
    if "after_requests" in fresh:
        for label, key in (("voice loaded", "loaded"), ("after 3 requests", "after_requests"),
                           (f"after trim ({fresh['trim_ms']:.0f} ms)", "after_trim")):
            m = fresh[key]
            rows.append((f"  engine alone, {label}: RSS", "MB", f"{m['rss_mb']:.0f}", None, TARGETS["peak_rss_mb"]))
        m = fresh["after_trim"]
        parts = " ".join(f"{k[7:-3]} {v:.0f}" for k, v in m.items() if k.startswith("params_"))
        rows.append(("    MLX buffers (all models)", "MB", f"{m['mlx_active_mb']:.0f}", None, None))
        rows.append((f"      {parts}", "", "", None, None))
        rows.append(("    MLX cache / rest (numpy, ORT, libs)", "MB", f"{m['mlx_cache_mb']:.0f} / {m['other_mb']:.0f}",
                     None, None))
        rows.append(("  engine alone, peak RSS", "MB", f"{fresh['peak_rss_mb']:.0f}", None, None))
    for half in (0, 1):
        probe = mem.get(f"lean_load_bert_half_{half}")
        if probe and "rss_mb" in probe:
            label = f"  loader alone{', fp16 RoBERTa' if half else ''}: RSS / peak"
            value = f"{probe['rss_mb']:.0f} / {probe['peak_rss_mb']:.0f}"
            rows.append((label, "MB", value, None, TARGETS["peak_rss_mb"]))
    lines = [
        f"primespeech-mlx bench: MLX {env['mlx']} on {env['device']}, BLAS {env['blas']} "
        f"(256² matmul {env['blas_matmul256_ms']} ms), {env['cpu_count']} CPUs, threads {env['threads']}",
        f"memory bandwidth: gemv {bw.get('gemv_gb_s', '-')} GB/s, 1-thread sum {bw.get('sum_1thread_gb_s', '-')} "
        f"GB/s; decode reads {bw.get('decode_bytes_per_token_mb', '-')} MB/token; loadavg at start "
        f"{report['loadavg_start']}, end {report['loadavg_end']}; repeat {report['repeat']}",
        *[f"path {stage}: {path} ({why})" for stage, (path, why) in env.get("paths", {}).items()],
        "",
        f"{'stage':<40} {'unit':<14} {'min / median':>18} {'PyTorch CPU':>12} {'target':>8}",
    ]
    for name, unit, value, upstream, target in rows:
        up = "-" if upstream is None else f"{upstream:g}"
        tg = "-" if target is None else (target if isinstance(target, str) else f"{target:g}")
        lines.append(f"{name:<40} {unit:<14} {value:>18} {up:>12} {tg:>8}")
    if "error" in en:
        lines.append(f"engine: {en['error']}")
    return "\n".join(lines)
