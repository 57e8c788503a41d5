"""The stage bench (HuBERT, BERT, GPT prefill and decode, SoVITS) and the end-to-end engine bench."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from .measure import _summary, loadavg, measure_bandwidth, rss_mb, timed
from .memory import memory_breakdown
from .weights import (
    N_BERT_TOKENS,
    N_PROMPT_TOKENS,
    N_TARGET_PHONES,
    N_TOKENS,
    TARGET_TEXT,
    bench_voice,
    gpt_inputs,
    weight_bytes_per_token,
)


def bench_stages(root: Path, repeat: int, stages: set[str], runtime=None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each stage alone under ``runtime`` (default: the bench's, :func:`.measure.bench_runtime`)."""
    import mlx.core as mx

    from ..convert import load
    from ..models import audio
    from ..models.gpt.generate import SamplingParams, generate
    from ..models.hubert.model import prompt_features
    from ..models.sovits import vocoder

    rng = np.random.default_rng(0)
    results: dict[str, Any] = {}
    t = time.perf_counter()
    if runtime is None:
        from .measure import bench_runtime

        runtime = bench_runtime()
    gpt = load.load_gpt(root / "gpt", runtime=runtime)
    sovits = load.load_sovits(root / "sovits", runtime=runtime)
    hubert = load.load_hubert(root / "hubert", runtime=runtime)
    bert, _tok = load.load_bert(root / "bert", runtime=runtime)
    memory = {"load_s": time.perf_counter() - t, "rss_models_loaded_mb": rss_mb()}

    wav32k, _ = audio.load_wav(root / "reference.wav")
    wav16k = audio.resample(wav32k, 32000, 16000)

    if "hubert" in stages:
        def run_hubert():
            mx.eval(prompt_features(hubert, wav16k))

        results["hubert"] = _summary([s * 1e3 for s in timed(run_hubert, repeat)], "ms", what="5 s reference + 0.6 s")
        ssl = prompt_features(hubert, wav16k)
        codes = sovits.extract_latent(ssl)
        results["extract_latent"] = _summary(
            [s * 1e3 for s in timed(lambda: mx.eval(sovits.extract_latent(ssl)), repeat)], "ms"
        )
        n_prompt = int(codes.shape[-1])
    else:
        n_prompt = N_PROMPT_TOKENS

    if "bert" in stages:
        ids = mx.array(rng.integers(5, bert.args.vocab_size, (1, N_BERT_TOKENS)).astype(np.int32))
        results["bert"] = _summary(
            [s * 1e3 for s in timed(lambda: mx.eval(bert(ids)), repeat)], "ms", what=f"{N_BERT_TOKENS} tokens"
        )

    phones, feats, prompt = gpt_inputs(gpt, rng, n_prompt)

    if "gpt" in stages:
        backend = gpt.decoder.backend

        def run_prefill():  # what the generation loop runs on this device (returns evaluated numpy logits)
            gpt.decoder.prefill(phones, feats, prompt, 1)

        results["gpt_prefill"] = _summary(
            [s * 1e3 for s in timed(run_prefill, repeat)],
            "ms",
            what=f"{phones.shape[1]} phones + {n_prompt} prompt tokens",
            backend=backend,
        )
        per_token, step_ms = [], []
        params = SamplingParams(top_k=15, top_p=1.0, temperature=1.0, repetition_penalty=1.35)
        for r in range(repeat + 1):
            gen = generate(gpt, phones, feats, prompt, params, early_stop_num=gpt.args.early_stop_num, seed=r)
            stamps = [time.perf_counter()]
            n = 0
            for _ in gen:
                stamps.append(time.perf_counter())
                n += 1
            if n != N_TOKENS:
                raise RuntimeError(f"bench GPT produced {n} tokens instead of {N_TOKENS} (EOS not suppressed?)")
            if r == 0:
                continue  # warm-up
            steps = np.diff(stamps[1:]) * 1e3  # token k -> k+1: one decode step plus sampling
            per_token.append(float(steps.mean()))
            step_ms.append(float(np.median(steps)))
        results["gpt_decode"] = _summary(
            per_token,
            "ms/token",
            what=f"{N_TOKENS} tokens, top_k 15, incl. sampling",
            step_median_ms=min(step_ms),
            backend=backend,
            half_weights=bool(getattr(gpt.decoder, "half", False)),
        )
        if backend == "numpy":
            results.update(_decode_step_half_vs_fp32(gpt, phones, feats, prompt, repeat))
            results.update(_decode_step_batched(gpt, phones, feats, prompt, repeat))
        kv_rows = phones.shape[1] + n_prompt + N_TOKENS / 2
        bw = measure_bandwidth()
        nbytes = weight_bytes_per_token(gpt, kv_rows)
        best_bw = max(bw["gemv_gb_s"], bw["sum_gb_s"])
        floor_ms = nbytes / (best_bw * 1e9) * 1e3
        results["bandwidth"] = {
            "gemv_gb_s": round(bw["gemv_gb_s"], 2),
            "sum_1thread_gb_s": round(bw["sum_gb_s"], 2),
            "decode_bytes_per_token_mb": round(nbytes / 1e6, 1),
            "decode_floor_ms": round(floor_ms, 2),
            "decode_vs_floor": round(results["gpt_decode"]["min"] / floor_ms, 2),
            "loadavg": loadavg(),
        }

    if "sovits" in stages:
        spec = audio.spectrogram(wav32k, sovits.args.filter_length, sovits.args.hop_length, sovits.args.win_length)
        ge = sovits.ref_embedding(mx.array(spec))
        mx.eval(ge)
        codes100 = mx.array(rng.integers(0, 1024, (1, 1, N_TOKENS)).astype(np.int32))
        target = mx.array(phones[:, -N_TARGET_PHONES:])
        # the SoVITS decode per vocoder backend, alternated in one run (models/sovits/vocoder.py); "sovits" is
        # the backend the engine picks here
        chosen = vocoder.from_runtime(sovits, runtime.replace(release_mlx=False), root / "sovits")
        sovits.use_vocoder(chosen)
        onnx_gen = chosen.generator
        backends = {"mlx": None}
        if (onnx_gen is None and chosen.error is None) or chosen.active == "openvino":  # measured all the same
            sovits.use_vocoder(vocoder.build(sovits, cache_dir=root / "sovits", mode="onnx", release_mlx=False))
            onnx_gen = sovits.vocoder_backend.generator
        if onnx_gen is not None:
            backends.update(_onnx_variants(sovits, onnx_gen, root / "sovits"))
            backends.update(_openvino_variant(sovits, root / "sovits", chosen))
        per_backend: dict[str, list[float]] = {name: [] for name in backends}
        info = {}
        for name, backend in backends.items():
            sovits.use_vocoder(backend or vocoder.VocoderBackend("mlx"))
            out = sovits.decode(codes100, target, ge=ge, noise_scale=0.5, seed=0)  # warm-up
            info[name] = (out.shape[-1] / sovits.sampling_rate, bool(mx.all(mx.isfinite(out)).item()))
        for _ in range(repeat):
            for name, backend in backends.items():
                sovits.use_vocoder(backend or vocoder.VocoderBackend("mlx"))
                per_backend[name] += timed(
                    lambda: mx.eval(sovits.decode(codes100, target, ge=ge, noise_scale=0.5, seed=0)), 1, warmup=0
                )
        sovits.use_vocoder(chosen)
        if "onnxruntime_split" in backends:
            results.update(_vocoder_side_by_side(backends["onnxruntime_split"].split, np.asarray(ge), repeat))
        for name, samples in per_backend.items():
            seconds, finite = info[name]
            results[f"sovits_{name}"] = _summary(
                [s / seconds for s in samples], "s/s audio", what=f"{N_TOKENS} tokens -> {seconds:.2f} s",
                finite=finite, backend=name,
            )
        active = "onnxruntime_split" if chosen.split else chosen.active
        results["sovits"] = dict(results[f"sovits_{active}"], status=vocoder.status(sovits))
        results["ref_embedding"] = _summary(
            [s * 1e3 for s in timed(lambda: mx.eval(sovits.ref_embedding(mx.array(spec))), repeat)], "ms"
        )
    memory["rss_after_stages_mb"] = rss_mb()
    return results, memory


def _vocoder_side_by_side(split, ge: np.ndarray, repeat: int) -> dict[str, Any]:
    """``split`` (the SplitRunner of :func:`_onnx_variants`, N >= 2 parts): N sentences' vocoders (100 tokens each)
    one after another on its N-thread session (what the engine does) against all N at once, each a one-thread run
    of its one-thread graph: whether sentences on separate cores would use the cores better. Seconds per sentence,
    alternating in one run."""
    import threading

    n, wide, single = split.parts, split.whole, split.fn
    frames = N_TOKENS * 2  # v2: two latent frames per semantic token
    channels = int(wide.session.get_inputs()[0].shape[1])
    z = np.random.default_rng(0).standard_normal((1, channels, frames), np.float32)

    def after_another():
        for _ in range(n):
            wide(z, ge)

    def at_once():
        threads = [threading.Thread(target=single, args=(z, ge)) for _ in range(n)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()

    after_another(), at_once()  # warm-up
    samples: dict[str, list[float]] = {"after_another": [], "at_once": []}
    for _ in range(repeat):
        for name, fn in (("after_another", after_another), ("at_once", at_once)):
            samples[name] += [s / n for s in timed(fn, 1, warmup=0)]
    return {f"vocoder_{name}": _summary(v, "s", what=f"{n} sentences of {N_TOKENS} tokens, seconds per sentence",
                                        sentences=n) for name, v in samples.items()}


def _onnx_variants(sovits, gen, cache_dir: Path) -> dict[str, Any]:
    """The ONNX Runtime vocoder as one run with the configured intra-op threads, and (2+ threads) cut into one
    single-threaded run per thread (models/sovits/vocoder_split.py), each as a backend for the SoVITS stage."""
    from ..models.sovits import vocoder, vocoder_onnx
    from ..models.sovits.vocoder_split import SplitRunner

    n = vocoder_onnx.resolve_threads(None)
    source = gen.path if gen.path is not None else vocoder_onnx.build_generator_model(sovits.dec).SerializeToString()
    whole = gen if gen.threads == n else vocoder_onnx.OnnxGenerator(source, n, spin=gen.spin)
    out = {"onnxruntime": vocoder.VocoderBackend("onnx", whole)}
    if gen.path is not None:  # the same graph with ONNX Runtime's CPU memory arena (off by default)
        arena = vocoder_onnx.OnnxGenerator(gen.path, n, arena=True, spin=gen.spin)
        out["onnxruntime_arena"] = vocoder.VocoderBackend("onnx", arena)
    if n > 1:  # as vocoder.build cuts: parts on the one-thread graph, short latents whole on the n-thread one
        single = vocoder_onnx.load_or_build(sovits.dec, cache_dir, 1)
        split = SplitRunner(single, n, sovits.dec.receptive_frames, sovits.samples_per_frame, whole=whole)
        out["onnxruntime_split"] = vocoder.VocoderBackend("onnx", whole, split=split)
    return out


def _openvino_variant(sovits, cache_dir: Path, chosen) -> dict[str, Any]:
    """The vocoder on OpenVINO (``PRIMESPEECH_VOCODER=openvino``) with the configured threads, as a backend for the
    SoVITS stage, where the extra is installed (else nothing: not measured); and in bfloat16
    (``PRIMESPEECH_PRECISION=bf16``) where the CPU has bfloat16 products."""
    from ..models.sovits import vocoder

    out = {}
    if vocoder.bf16_status() is None:  # PRIMESPEECH_PRECISION=bf16's vocoder, where the CPU has bfloat16 products
        from ..models.sovits import vocoder_openvino

        try:
            bf16 = vocoder_openvino.load_or_build(sovits.dec, cache_dir, None, precision="bf16")
            out["openvino_bf16"] = vocoder.VocoderBackend("openvino", bf16)
        except Exception:  # not compilable here
            pass
    if chosen.active == "openvino" and getattr(chosen.generator, "precision", "f32") == "f32":
        return {"openvino": chosen, **out}
    try:
        from ..models.sovits import vocoder_openvino

        gen = vocoder_openvino.load_or_build(sovits.dec, cache_dir, None)
    except Exception:  # not installed, or not loadable here
        return out
    return {"openvino": vocoder.VocoderBackend("openvino", gen), **out}


def _decode_step_half_vs_fp32(gpt, phones, feats, prompt, repeat: int) -> dict[str, Any]:
    """The numpy decode step with float16 weights (the default where available), with float32 copies of the same
    weights and, where the CPU runs it, with the opt-in int8 weights (``PRIMESPEECH_PRECISION=int8``), alternating
    token by token in one run: ms per step over N_TOKENS steps."""
    from ..models.gpt.numpy_decoder import NumpyDecoder
    from ..models.kernels import q8

    half = gpt.decoder
    if not getattr(half, "half", False):
        return {}
    full = NumpyDecoder(gpt, half=False)
    decoders = [("half", half), ("fp32", full)]
    runtime = getattr(half, "runtime", None)
    if runtime is not None and q8.status(runtime.replace(precision="int8"))[0] is not None:
        decoders.append(("int8", NumpyDecoder(gpt, runtime=runtime.replace(precision="int8"))))
    args = (phones, feats, prompt, N_TOKENS)
    times: dict[str, list[float]] = {name: [] for name, _ in decoders}
    prefill: dict[str, list[float]] = {"half": [], "fp32": []}
    tokens = np.random.default_rng(1).integers(0, 1024, N_TOKENS)
    for _ in range(max(1, repeat)):
        states = {}
        for name, dec in decoders:
            t = time.perf_counter()
            states[name] = dec.prefill(*args)[0]
            if name in prefill:
                prefill[name].append((time.perf_counter() - t) * 1e3)
        for i, tok in enumerate(tokens):
            for name, st in states.items():
                t = time.perf_counter()
                st.step(int(tok), prompt.shape[1] + i)
                times[name].append((time.perf_counter() - t) * 1e3)
    del full, decoders
    out = {f"gpt_step_{k}": _summary(v, "ms/step", what="numpy decode step alone") for k, v in times.items()}
    out.update({f"gpt_prefill_{k}": _summary(v, "ms", what="numpy prefill") for k, v in prefill.items()})
    return out


BATCH_ROWS = (1, 2, 3, 4, 6, 8)


def _decode_step_batched(gpt, phones, feats, prompt, repeat: int) -> dict[str, Any]:
    """The numpy decode step for ``B`` generations at once (continuous batching, ``numpy_decoder.step_batch``), each
    width in turn within every round: ms per token (step time / B) over N_TOKENS steps. Where the per-token time
    stops falling, batching stops paying on this CPU."""
    from ..models.gpt.numpy_decoder import step_batch

    dec = gpt.decoder
    if not getattr(dec, "half", False):
        return {}
    times: dict[int, list[float]] = {b: [] for b in BATCH_ROWS}
    tokens = np.random.default_rng(2).integers(0, 1024, N_TOKENS)
    for _ in range(max(1, repeat)):
        for b in BATCH_ROWS:
            states = [dec.prefill(phones, feats, prompt, N_TOKENS)[0] for _ in range(b)]
            for i, tok in enumerate(tokens):
                t = time.perf_counter()
                step_batch(states, [int(tok)] * b, [prompt.shape[1] + i] * b)
                times[b].append((time.perf_counter() - t) * 1e3 / b)
            del states
    return {f"gpt_batch_{b}": _summary(v, "ms/token", what=f"{b} rows per decode step") for b, v in times.items()}


def bench_engine(root: Path, repeat: int, stream: bool = True, runtime=None) -> dict[str, Any]:
    """End to end through :class:`GPTSoVITSEngine` (under ``runtime``; default: the settings') with the reference
    cached: whole and streaming."""
    from ..engine import GPTSoVITSEngine

    spec = bench_voice(root)
    engine = GPTSoVITSEngine(model_dir=root, runtime=runtime)
    t = time.perf_counter()
    engine.load_voice(spec)
    first_load = time.perf_counter() - t
    out: dict[str, Any] = {"load_voice_s": round(first_load, 2), "rss_engine_loaded_mb": rss_mb()}
    opts = {"text_split_method": "cut0", "top_k": 15, "seed": 1}

    last = {}

    def whole():
        last["result"] = engine.synthesize(TARGET_TEXT, voice=spec, **opts)

    samples = timed(whole, repeat)
    res = last["result"]
    out["e2e_cached_reference"] = _summary(
        [s * 1e3 for s in samples],
        "ms",
        what=f"{len(res.semantic_tokens)} tokens -> {res.duration:.2f} s",
        timings={k: round(v * 1e3, 1) for k, v in res.timings.items()},
    )
    if stream:
        ttfa, totals = [], []

        def streamed():
            t0 = time.perf_counter()
            first = None
            for _chunk in engine.synthesize_stream(TARGET_TEXT, voice=spec, **opts):
                if first is None:
                    first = time.perf_counter() - t0
            ttfa.append(first)
            totals.append(time.perf_counter() - t0)

        streamed()  # warm-up (new window shapes)
        ttfa.clear()
        totals.clear()
        for _ in range(repeat):
            streamed()
        out["time_to_first_audio"] = _summary([s * 1e3 for s in ttfa], "ms", what="streaming, first chunk")
        out["stream_total"] = _summary([s * 1e3 for s in totals], "ms")
    out["rss_after_engine_mb"] = rss_mb()
    out["memory_after_engine"] = memory_breakdown(engine)
    return out
