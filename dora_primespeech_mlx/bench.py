"""``primespeech-mlx bench``: how fast is this machine, stage by stage, with real-size v2 models.

The four models are built with **random weights** and the exact real v2 configurations (GPT d=512 x 24
layers, SoVITS v2 with its 512-channel HiFi-GAN, chinese-hubert-base, chinese-roberta-wwm-ext-large),
so no download is needed and every step costs what it costs with the real files (random weights change
no shape). They are written once as converted MLX folders into a cache directory and loaded through the
same loader the engine uses. Inputs follow the upstream PyTorch baseline (performance-notes.md §3): a
5 s reference, the prompt "这是一段用于测试的参考音频。" (27 phones, 139 prompt tokens) and the 20-character
target "今天的天气特别好，我们一起去公园里散步聊天吧。" (44 phones, 23 BERT tokens), 100 semantic
tokens (the GPT's EOS is made unreachable and ``max_sec`` is 2, so every run decodes exactly 100).

Each stage runs once to warm up, then ``--repeat`` times; min and median are reported with the
1-minute load average at the time. The memory-bandwidth floor of the decode step (bytes of weights
and KV cache read per token / the measured read bandwidth) is measured in the same run. Not a test.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import wave
from pathlib import Path
from typing import Any

import numpy as np

from .settings import read as read_setting

PROMPT_TEXT = "这是一段用于测试的参考音频。"
TARGET_TEXT = "今天的天气特别好，我们一起去公园里散步聊天吧。"
REF_SECONDS = 5.0
N_PROMPT_PHONES = 27  # what the v2 front end gives for PROMPT_TEXT
N_TARGET_PHONES = 44  # ... and for TARGET_TEXT
N_BERT_TOKENS = 23  # [CLS] + 21 characters + [SEP]
N_PROMPT_TOKENS = 139  # HuBERT frames of 5.6 s at 16 kHz, halved by ssl_proj
N_TOKENS = 100
BENCH_MAX_SEC = N_TOKENS / 50  # early_stop_num = 50 * max_sec = 100
MODELS_FORMAT = 3  # bump when the generated files change

# PyTorch upstream, 2-core AMD EPYC VM, torch 2.13, 2 threads (performance-notes.md section 3), in ms.
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


# ---------------------------------------------------------------------------------------------------
# measurement helpers
# ---------------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------------
# random-weight real-size models
# ---------------------------------------------------------------------------------------------------


def default_models_dir() -> Path:
    return Path(read_setting("cache_dir")) / f"bench-models-v{MODELS_FORMAT}"


def _save_converted(dst: Path, kind: str, args, model) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    dst.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(dst / "model.safetensors"), weights)
    meta = {"format_version": 1, "kind": kind, "version": "v2", "args": args.to_dict(), "source": "bench (random)"}
    (dst / "config.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")


def _suppress_eos(model) -> None:
    """Make the GPT's EOS logit -1e4 for every input: one feature of the last block's output is set to
    a constant 1 (LayerNorm weight 0, bias 1) and only the EOS row of the head reads it."""
    import mlx.core as mx

    last = model.layers[-1].norm2
    last.weight = last.weight.at[0].add(-last.weight[0])
    last.bias = last.bias.at[0].add(1.0 - last.bias[0])
    w = model.predict.weight
    w = w.at[:, 0].multiply(0.0)
    model.predict.weight = w.at[model.args.eos, 0].add(-1e4)
    mx.eval(model.parameters())


def _float16_values(model) -> None:
    """Round every float32 weight to the nearest float16 value (kept as float32): the released
    checkpoints are float16, and paths that keep them in float16 check for it (t2s_numpy.half_weights)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten

    params = [(k, v.astype(mx.float16).astype(mx.float32)) for k, v in tree_flatten(model.parameters())
              if v.dtype == mx.float32]
    model.update(tree_unflatten(params))


def _bench_vocab(size: int) -> list[str]:
    """A BERT vocabulary of the real size: specials, ASCII and punctuation, then CJK characters."""
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words += [chr(c) for c in range(33, 127)] + list("，。！？、；：“”‘’（）《》…—·")
    cjk = 0x4E00
    while len(words) < size:
        words.append(chr(cjk))
        cjk += 1
    return words[:size]


def _write_reference(path: Path, seconds: float = REF_SECONDS, sr: int = 32000) -> None:
    """A speech-like 5 s clip (harmonics of a gliding pitch, amplitude-modulated syllables, noise)."""
    t = np.arange(int(seconds * sr)) / sr
    f0 = 140 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / sr
    voiced = sum(np.sin(k * phase) / k for k in range(1, 12))
    env = 0.5 + 0.5 * np.sin(2 * np.pi * 4.0 * t) ** 2
    x = 0.25 * env * voiced / 3 + 0.01 * np.random.default_rng(0).standard_normal(len(t))
    pcm = np.clip(x * 32767, -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sr)
        w.writeframes(pcm.tobytes())


def make_models(root: Path) -> Path:
    """Write the four random-weight real-size models (converted MLX folders), a BERT tokenizer and a
    reference clip into ``root``; returns ``root``. Skips what is already there."""
    _preload_blas()
    import mlx.core as mx

    from .models.bert import BertArgs, BertModel
    from .models.hubert import HubertArgs, HubertModel
    from .models.sovits import SoVITSArgs, SoVITSModel
    from .models.t2s import T2SArgs, T2SModel

    root.mkdir(parents=True, exist_ok=True)
    mx.random.seed(0)
    builders = {
        "gpt": lambda: T2SArgs(max_sec=BENCH_MAX_SEC),
        "sovits": SoVITSArgs,
        "hubert": HubertArgs,
        "bert": BertArgs,
    }
    classes = {"gpt": T2SModel, "sovits": SoVITSModel, "hubert": HubertModel, "bert": BertModel}
    for kind, make_args in builders.items():
        dst = root / kind
        if (dst / "model.safetensors").is_file():
            continue
        args = make_args()
        model = classes[kind](args)
        if kind == "gpt":
            _suppress_eos(model)
        _float16_values(model)  # like the released checkpoints, which store float16 weights
        mx.eval(model.parameters())
        _save_converted(dst, kind, args, model)
        if kind == "bert":
            (dst / "vocab.txt").write_text("\n".join(_bench_vocab(args.vocab_size)) + "\n", encoding="utf-8")
        del model
        gc.collect()
    ref = root / "reference.wav"
    if not ref.is_file():
        _write_reference(ref)
    return root


def ensure_models(root: Path) -> Path:
    """Build the models in a child process (so building does not count in this process's peak RSS)."""
    done = all((root / k / "model.safetensors").is_file() for k in ("gpt", "sovits", "hubert", "bert"))
    if done and (root / "reference.wav").is_file():
        return root
    print(f"bench: writing random-weight real-size models to {root} (once) ...", file=sys.stderr)
    code = "import sys, pathlib; import dora_primespeech_mlx.bench as b; b.make_models(pathlib.Path(sys.argv[1]))"
    subprocess.run([sys.executable, "-c", code, str(root)], check=True)
    return root


def bench_voice(root: Path):
    from .voices import VoiceSpec

    return VoiceSpec(
        name="bench",
        language="zh",
        prompt_text=PROMPT_TEXT,
        prompt_lang="zh",
        speed_factor=1.0,
        gpt=root / "gpt",
        sovits=root / "sovits",
        reference=root / "reference.wav",
        hubert=root / "hubert",
        bert=root / "bert",
        source="custom",
    )


def weight_bytes_per_token(gpt, kv_rows: float) -> int:
    """Bytes a decode step must read: every block weight, the head, and the KV cache rows attended."""
    from mlx.utils import tree_flatten

    total = 0
    for name, p in tree_flatten(gpt.parameters()):
        if name.startswith(("layers.", "predict.")):
            total += p.nbytes
    a = gpt.args
    total += int(a.num_layers * 2 * kv_rows * a.hidden_dim * 4)
    return total


def memory_probe(root: Path, bert_half: bool = False) -> dict[str, float]:
    """Load the four models through the engine's loader (``convert.load``: one tensor at a time
    straight into MLX, heap trimmed after each model) and report RSS and the process peak. Run in a
    fresh process by :func:`memory_lean` (``bert_half`` picks the RoBERTa storage)."""
    from .convert import load

    models = [load.load_gpt(root / "gpt"), load.load_sovits(root / "sovits"), load.load_hubert(root / "hubert"),
              load.load_bert(root / "bert", half=bert_half)]
    out = {"rss_mb": rss_mb(), "peak_rss_mb": peak_rss_mb()}
    del models
    return out


def memory_lean(root: Path, bert_half: bool) -> dict[str, float]:
    code = (
        "import sys, json, pathlib; import dora_primespeech_mlx.bench as b; "
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
    ``release_mlx`` / ``arena`` / ``trim_reference`` / ``decoder_at_load``: the memory levers
    (``vocoder.RELEASE_MLX``, ``vocoder_onnx.ARENA``, ``store.TRIM_AFTER_REFERENCE``, ``load.DECODER_AT_LOAD``)."""
    from .convert import load
    from .engine import GPTSoVITSEngine, store
    from .engine.store import trim_after_request
    from .models import vocoder, vocoder_onnx

    vocoder.RELEASE_MLX, vocoder_onnx.ARENA, store.TRIM_AFTER_REFERENCE = release_mlx, arena, trim_reference
    load.DECODER_AT_LOAD = decoder_at_load

    spec = bench_voice(root)
    engine = GPTSoVITSEngine(model_dir=root)
    engine.load_voice(spec)
    out: dict[str, Any] = {"loaded": memory_breakdown(engine)}
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
        "import sys, json, pathlib; import dora_primespeech_mlx.bench as b; b._preload_blas(); "
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
                    f"{m['after_trim']['rss_mb']:.0f} ({m['trim_ms']:.0f} ms) | {m['peak_rss_mb']:.0f} | "
                    f"{m['after_trim']['mlx_active_mb']:.0f} | {m['after_trim']['other_mb']:.0f} | {loadavg()} |")
        print(rows[-1], file=sys.stderr, flush=True)
    bert = "/".join(sorted(dtypes))  # the storage the engines chose (PRIMESPEECH_BERT_HALF, auto by default)
    head = (f"engine RSS (MB), bench voice, RoBERTa {bert}, fresh process per row\n"
            "| levers | voice loaded | after 3 requests | after end-of-request trim | peak | MLX buffers "
            "| rest | loadavg |\n|---|---|---|---|---|---|---|---|")
    return "\n".join([head, *rows])


# ---------------------------------------------------------------------------------------------------
# stages
# ---------------------------------------------------------------------------------------------------


def bench_stages(root: Path, repeat: int, stages: set[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    import mlx.core as mx

    from .convert import load
    from .models import audio, vocoder
    from .models.hubert import prompt_features
    from .models.t2s_generate import SamplingParams, generate

    rng = np.random.default_rng(0)
    results: dict[str, Any] = {}
    t = time.perf_counter()
    gpt = load.load_gpt(root / "gpt")
    sovits = load.load_sovits(root / "sovits")
    hubert = load.load_hubert(root / "hubert")
    bert, _tok = load.load_bert(root / "bert")
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

    phones = rng.integers(0, gpt.args.phoneme_vocab_size, (1, N_PROMPT_PHONES + N_TARGET_PHONES)).astype(np.int32)
    feats = (0.1 * rng.standard_normal((1, 1024, phones.shape[1]))).astype(np.float32)
    prompt = rng.integers(0, 1024, (1, n_prompt)).astype(np.int32)

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
        # the SoVITS decode per vocoder backend, alternated in one run (models/vocoder.py); "sovits" is
        # the backend the engine picks here
        chosen = vocoder.attach(sovits, cache_dir=root / "sovits", release_mlx=False,
                                parts=read_setting("vocoder_parts")).vocoder_backend
        onnx_gen = chosen.generator
        backends = {"mlx": None}
        if onnx_gen is None and chosen.error is None:  # not chosen on this device: measured all the same
            vocoder.attach(sovits, cache_dir=root / "sovits", mode="onnx", release_mlx=False)
            onnx_gen = sovits.vocoder_backend.generator
        if onnx_gen is not None:
            backends.update(_onnx_variants(sovits, onnx_gen))
        per_backend: dict[str, list[float]] = {name: [] for name in backends}
        info = {}
        for name, backend in backends.items():
            sovits.vocoder_backend = backend or vocoder.VocoderBackend("mlx")
            out = sovits.decode(codes100, target, ge=ge, noise_scale=0.5, seed=0)  # warm-up
            info[name] = (out.shape[-1] / sovits.sampling_rate, bool(mx.all(mx.isfinite(out)).item()))
        for _ in range(repeat):
            for name, backend in backends.items():
                sovits.vocoder_backend = backend or vocoder.VocoderBackend("mlx")
                per_backend[name] += timed(
                    lambda: mx.eval(sovits.decode(codes100, target, ge=ge, noise_scale=0.5, seed=0)), 1, warmup=0
                )
        sovits.vocoder_backend = chosen
        for name, samples in per_backend.items():
            seconds, finite = info[name]
            results[f"sovits_{name}"] = _summary(
                [s / seconds for s in samples], "s/s audio", what=f"{N_TOKENS} tokens -> {seconds:.2f} s",
                finite=finite, backend=name,
            )
        active = "mlx" if chosen.active == "mlx" else ("onnxruntime_split" if chosen.split else "onnxruntime")
        results["sovits"] = dict(results[f"sovits_{active}"], status=vocoder.status(sovits))
        results["ref_embedding"] = _summary(
            [s * 1e3 for s in timed(lambda: mx.eval(sovits.ref_embedding(mx.array(spec))), repeat)], "ms"
        )
    memory["rss_after_stages_mb"] = rss_mb()
    return results, memory


def _onnx_variants(sovits, gen) -> dict[str, Any]:
    """The ONNX Runtime vocoder as one run with the configured intra-op threads, and (2+ threads) cut into one
    single-threaded run per thread (models/vocoder_split.py), each as a backend for the SoVITS stage."""
    from .models import vocoder, vocoder_onnx
    from .models.vocoder_split import SplitRunner

    n = vocoder_onnx.resolve_threads(None)
    source = gen.path if gen.path is not None else vocoder_onnx.build_generator_model(sovits.dec).SerializeToString()
    whole = gen if gen.threads == n else vocoder_onnx.OnnxGenerator(source, n)
    out = {"onnxruntime": vocoder.VocoderBackend("onnx", whole)}
    if gen.path is not None:  # the same graph with ONNX Runtime's CPU memory arena (off by default)
        out["onnxruntime_arena"] = vocoder.VocoderBackend("onnx", vocoder_onnx.OnnxGenerator(gen.path, n, arena=True))
    if n > 1:
        single = gen if gen.threads == 1 else vocoder_onnx.OnnxGenerator(source, 1)
        split = SplitRunner(single, n, sovits.dec.receptive_frames, sovits.samples_per_frame)
        out["onnxruntime_split"] = vocoder.VocoderBackend("onnx", single, split=split)
    return out


def _decode_step_half_vs_fp32(gpt, phones, feats, prompt, repeat: int) -> dict[str, Any]:
    """The numpy decode step with float16 weights (the default where available) and with float32 copies
    of the same weights, alternating token by token in one run: ms per step over N_TOKENS steps."""
    from .models.t2s_numpy import NumpyDecoder

    half = gpt.decoder
    if not getattr(half, "half", False):
        return {}
    full = NumpyDecoder(gpt, half=False)
    args = (phones, feats, prompt, N_TOKENS)
    times: dict[str, list[float]] = {"half": [], "fp32": []}
    prefill: dict[str, list[float]] = {"half": [], "fp32": []}
    tokens = np.random.default_rng(1).integers(0, 1024, N_TOKENS)
    for _ in range(max(1, repeat)):
        states = {}
        for name, dec in (("half", half), ("fp32", full)):
            t = time.perf_counter()
            states[name] = dec.prefill(*args)[0]
            prefill[name].append((time.perf_counter() - t) * 1e3)
        for i, tok in enumerate(tokens):
            for name, st in states.items():
                t = time.perf_counter()
                st.step(int(tok), prompt.shape[1] + i)
                times[name].append((time.perf_counter() - t) * 1e3)
    del full
    out = {f"gpt_step_{k}": _summary(v, "ms/step", what="numpy decode step alone") for k, v in times.items()}
    out.update({f"gpt_prefill_{k}": _summary(v, "ms", what="numpy prefill") for k, v in prefill.items()})
    return out


def bench_engine(root: Path, repeat: int, stream: bool = True) -> dict[str, Any]:
    """End to end through :class:`GPTSoVITSEngine` with the reference cached: whole and streaming."""
    from .engine import GPTSoVITSEngine

    spec = bench_voice(root)
    engine = GPTSoVITSEngine(model_dir=root)
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


# ---------------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------------


def environment() -> dict[str, Any]:
    import mlx.core as mx

    from . import _blas
    from .models.cpu_paths import chosen as chosen_paths

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
          for key, name in (("half", "float16"), ("fp32", "float32")) if f"gpt_step_{key}" in st],
        *[(f"  prefill, {name} weights", "ms", _fmt(st.get(f"gpt_prefill_{key}")), None, None)
          for key, name in (("half", "float16"), ("fp32", "float32")) if f"gpt_prefill_{key}" in st],
        ("  bandwidth floor of the decode step", "ms/token",
         f"{bw['decode_floor_ms']:.2f} (x{bw['decode_vs_floor']})" if bw else "-", None,
         f"x{TARGETS['gpt_decode_vs_floor']}"),
        (f"SoVITS decode ({st.get('sovits', {}).get('backend', '-')}, the engine's)", "s per s audio",
         _fmt(st.get("sovits"), digits=3), round(UPSTREAM_MS["sovits_s_per_audio_s"], 3),
         TARGETS["sovits_s_per_audio_s"]),
        *[(f"  SoVITS with the {name} vocoder", "s per s audio", _fmt(st.get(f"sovits_{name}"), digits=3), None,
           None) for name in ("mlx", "onnxruntime", "onnxruntime_split", "onnxruntime_arena")
           if f"sovits_{name}" in st],
        *[("  SoVITS onnxruntime cut per thread / whole (same run)", "ratio",
           f"{st['sovits_onnxruntime_split']['min'] / st['sovits_onnxruntime']['min']:.2f} / "
           f"{st['sovits_onnxruntime_split']['median'] / st['sovits_onnxruntime']['median']:.2f}", None, None)
          for _ in [0] if "sovits_onnxruntime_split" in st and "sovits_onnxruntime" in st],
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


def _preload_blas() -> None:
    """The fast CBLAS before mlx loads (importing the package no longer does it; without this the bench
    measured MLX on the netlib reference BLAS: a 256² matmul in 5.4 ms instead of 0.33 ms)."""
    from . import _blas

    _blas.preload()


def run(args) -> int:
    if args.compare:  # side by side with the original and the peers, each in its own process
        from .bench_compare import run_compare

        return run_compare(args)
    _preload_blas()
    root = Path(args.models_dir).expanduser() if args.models_dir else default_models_dir()
    if args.memory_levers:
        ensure_models(root)
        print(memory_levers(root))
        return 0
    stages = {s.strip() for s in args.stages.split(",") if s.strip()}
    unknown = stages - {"hubert", "bert", "gpt", "sovits", "e2e"}
    if unknown:
        print(f"error: unknown bench stages {sorted(unknown)} (use hubert,bert,gpt,sovits,e2e)", file=sys.stderr)
        return 2
    if args.device != "auto":
        import mlx.core as mx

        mx.set_default_device(mx.cpu if args.device == "cpu" else mx.gpu)
    ensure_models(root)
    report: dict[str, Any] = {"repeat": args.repeat, "loadavg_start": loadavg()}
    report["environment"] = environment()
    report["stages"], report["memory"] = bench_stages(root, args.repeat, stages)
    from .engine.store import release_memory

    release_memory()  # the stage models are gone (MLX cache and heap handed back); the engine loads its own
    if "e2e" in stages:
        try:
            report["engine"] = bench_engine(root, args.repeat, stream=not args.no_stream)
        except Exception as exc:  # the bench still reports the stages
            report["engine"] = {"error": f"{type(exc).__name__}: {exc}"}
    report["memory"]["peak_rss_mb"] = peak_rss_mb()
    if not args.no_memory_probe:
        try:
            report["memory"]["engine_fresh_process"] = memory_engine(root)
        except (subprocess.SubprocessError, ValueError) as exc:
            report["memory"]["engine_fresh_process"] = {"error": str(exc)}
        for half in (False, True):
            try:
                report["memory"][f"lean_load_bert_half_{int(half)}"] = memory_lean(root, half)
            except (subprocess.SubprocessError, ValueError) as exc:
                report["memory"][f"lean_load_bert_half_{int(half)}"] = {"error": str(exc)}
    report["loadavg_end"] = loadavg()
    if args.json:
        print(json.dumps(report, indent=2, ensure_ascii=False, default=str))
    else:
        print(table(report))
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark every stage with real-size random-weight models (no download)",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("-n", "--repeat", type=int, default=5, help="timed runs per stage after one warm-up (default 5)")
    p.add_argument("--json", action="store_true", help="print the full report as JSON")
    p.add_argument("--stages", default="hubert,bert,gpt,sovits,e2e", help="comma list (default: all)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "gpu"])
    p.add_argument("--no-stream", action="store_true", help="skip the streaming time-to-first-audio run")
    p.add_argument("--no-memory-probe", action="store_true", help="skip the lean-loading RSS probes")
    p.add_argument("--memory-levers", action="store_true",
                   help="only the engine's RSS with each vocoder memory lever on/off (fresh process each)")
    p.add_argument("--models-dir", help="where the random-weight models are written (default: user cache)")
    from .bench_compare import add_arguments

    add_arguments(p)
    p.set_defaults(func=run)
