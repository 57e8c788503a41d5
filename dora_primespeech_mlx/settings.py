"""The package's settings: every environment variable it reads is declared here, and read nowhere else.

Every setting has one primary name (the old dora-primespeech node's name where it had one, so existing
dataflows keep working) and optional aliases (the design document's ``GPTSVITS_*`` names and a few
others). **Precedence: the primary name, then the aliases in the order listed, then the default.** An
empty value counts as unset (old dataflows write ``PRIMESPEECH_MODEL_DIR: ""``). Dora passes ``env:`` values
as strings; every value is parsed and checked here, and all bad variables are reported together in one
:class:`ConfigError` when the node starts. Nothing is overridden behind the user's back: TOP_K, TOP_P,
TEMPERATURE, SEED, ... reach the engine as given.

The :class:`Settings` dataclass is the one table: each field's ``setting(...)`` gives its environment name,
aliases, default, parser, meaning and audience (:data:`VARS` is read off it); :func:`describe` lists them per
audience for the README and docs/ tables. The tuning settings take their defaults and choices from
:class:`~.runtime.Runtime`, which the engine builds from them."""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any

from . import defaults
from .errors import ConfigError
from .runtime import CHOICES
from .runtime import DEFAULT as _RT

DEFAULT_MODEL_DIR = "~/.dora/models/primespeech"  # the old node's default: its downloads are reused
COMPUTE_UNITS = CHOICES["coreml_compute_units"]  # CoreML compute units; the first is the default

# Languages the old node accepted for TEXT_LANG / PROMPT_LANG (all have a text front end; ja, ko and yue
# need the pip extras of the same name).
OLD_LANGS = ("auto", "auto_yue", "en", "zh", "ja", "yue", "ko", "all_zh", "all_ja", "all_yue", "all_ko")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
SPLIT_METHODS = defaults.TEXT_SPLIT_METHODS
STREAM_STARTS = ("gapless", "earliest")  # PRIMESPEECH_STREAM_START (engine/pacing.py PacingOptions.start)
SAMPLES_PER_TOKEN = 1280  # 32 kHz audio, 25 semantic tokens per second (two 640-sample frames each)

_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f"}


# ---------------------------------------------------------------------------------------------------
# Parsers: str -> value, raising ValueError with a short reason.


def expand(path: str | os.PathLike) -> Path:
    """Expand ``~`` and ``$VARS`` the way the old node did."""
    return Path(os.path.expandvars(os.path.expanduser(str(path))))


def _str(s: str) -> str:
    return s


def _bool(s: str) -> bool:
    v = s.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ValueError("expected true/false (or 1/0, yes/no, on/off)")


def _number(s: str) -> float:
    try:
        x = float(s.strip())
    except ValueError:
        raise ValueError("expected a number") from None
    if not math.isfinite(x):
        raise ValueError("expected a finite number")
    return x


def _int(s: str) -> int:
    x = _number(s)
    if x != int(x):
        raise ValueError("expected a whole number")
    return int(x)


def _ranged(parse: Callable[[str], Any], lo: float | None = None, hi: float | None = None,
            lo_open: bool = False) -> Callable[[str], Any]:
    def check(s: str):
        x = parse(s)
        if lo is not None and (x <= lo if lo_open else x < lo):
            raise ValueError(f"must be {'>' if lo_open else '>='} {lo}")
        if hi is not None and x > hi:
            raise ValueError(f"must be <= {hi}")
        return x

    return check


def _choice(values: tuple[str, ...], upper: bool = False, synonyms: Mapping[str, str] | None = None):
    def check(s: str) -> str:
        v = s.strip().upper() if upper else s.strip().lower()
        v = (synonyms or {}).get(v, v)
        if v not in values:
            raise ValueError(f"expected one of {', '.join(values)}")
        return v

    return check


def _limits(name: str) -> Callable[[str], Any]:
    """The parser of request parameter ``name`` with the range the engine enforces (defaults.RANGES)."""
    rng = defaults.RANGES[name]
    return _ranged(_int if rng.integer else _number, rng.lo, rng.hi, lo_open=rng.lo_open)


def _path(s: str) -> Path:
    return expand(s.strip())


def _folders(s: str) -> tuple[Path, ...] | str:
    """``*`` or folders separated by ``os.pathsep`` (``~`` and ``$VARS`` expanded: this is configuration)."""
    if s.strip() == "*":
        return "*"
    found = tuple(expand(p.strip()) for p in s.split(os.pathsep) if p.strip())
    if not found:
        raise ValueError(f"expected * or folders separated by {os.pathsep!r}")
    return found


def _cache_under(s: str) -> Path:
    return expand(s.strip()) / "dora_primespeech_mlx"


def _threads(s: str) -> int | str:
    v = s.strip().lower()
    if v == "auto":
        return v
    try:
        return _ranged(_int, 1)(v)
    except ValueError:
        raise ValueError("expected a positive number or auto") from None


def _auto_bool(s: str) -> bool | None:
    return None if s.strip().lower() == "auto" else _bool(s)


def _use_gpu(s: str) -> str:
    return "gpu" if _bool(s) else "cpu"


def _use_ane(s: str) -> str:
    return "auto" if _bool(s) else "mlx"


def _samples_to_tokens(s: str) -> int:
    samples = _ranged(_int, 1)(s)
    return min(1500, max(1, round(samples / SAMPLES_PER_TOKEN)))


_DEVICE = _choice(CHOICES["device"], synonyms={"cuda": "gpu", "mps": "gpu", "metal": "gpu"})
_LANG = _choice(OLD_LANGS)


AUDIENCES = ("contract", "tuning", "deployment")  # the README / docs/performance.md / docs/dataflow.md


@dataclass(frozen=True)
class Var:
    """One setting: field name, primary env name, aliases (each with its own parser when it differs), and who it is
    for (:data:`AUDIENCES`: the dataflow contract, speed and memory tuning, the node's deployment)."""

    field: str
    name: str
    default: Any
    parse: Callable[[str], Any]
    meaning: str
    aliases: tuple[str, ...] = ()
    alias_parse: tuple[tuple[str, Callable[[str], Any]], ...] = ()
    audience: str = "contract"

    def parser(self, env_name: str) -> Callable[[str], Any]:
        return dict(self.alias_parse).get(env_name, self.parse)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


_ORDER = itertools.count()


def setting(name: str, default: Any, parse: Callable[[str], Any], meaning: str, aliases: tuple[str, ...] = (),
            alias_parse: tuple[tuple[str, Callable[[str], Any]], ...] = (), audience: str = "contract"):
    """A :class:`Settings` field read from the environment variable ``name`` (then ``aliases``): its one default,
    its parser and meaning, for :data:`VARS` and the documentation."""
    if audience not in AUDIENCES:
        raise ValueError(f"audience {audience!r}: expected one of {', '.join(AUDIENCES)}")
    spec = {"name": name, "parse": parse, "meaning": meaning, "aliases": aliases, "alias_parse": alias_parse,
            "audience": audience, "order": next(_ORDER)}
    return dataclass_field(default=default, metadata={"setting": spec})


@dataclass(frozen=True)
class Settings(defaults.RequestDefaults):
    """The package's configuration, one field per setting: each field's ``setting(...)`` is its environment name,
    default, parser and meaning (the one table; :data:`VARS` is read off it). Build it with :meth:`from_env`."""

    voice: str = setting("VOICE_NAME", "Doubao", _str,
        "Voice at start: a preset or a user voice (`primespeech-mlx voices`).", ("GPTSVITS_VOICE",))
    model_dir: Path = setting("PRIMESPEECH_MODEL_DIR", expand(DEFAULT_MODEL_DIR), _path,
        "Model directory (old node layout; `~` and `$VAR` are expanded).", ("GPTSVITS_MODEL_DIR",))
    text_lang: str | None = setting("TEXT_LANG", None, _LANG,
        "Language of the text for the start voice (unset: the voice's language). After `change_voice` "
        "or a `VOICE:` prefix the language follows the new voice.", ("GPTSVITS_TEXT_LANG",))
    prompt_lang: str | None = setting("PROMPT_LANG", None, _LANG,
        "Language of the start voice's transcript (unset: the voice's).", ("GPTSVITS_PROMPT_LANG",))
    prompt_text: str | None = setting("PROMPT_TEXT", None, _str,
        "Transcript of the start voice's reference (unset: the voice's).", ("GPTSVITS_PROMPT_TEXT",))
    top_k: int = setting("TOP_K", defaults.TOP_K, _limits("top_k"), "GPT sampling: top-k.", ("GPTSVITS_TOP_K",))
    top_p: float = setting("TOP_P", defaults.TOP_P, _limits("top_p"), "GPT sampling: top-p.", ("GPTSVITS_TOP_P",))
    temperature: float = setting("TEMPERATURE", defaults.TEMPERATURE, _limits("temperature"),
        "GPT sampling temperature.", ("GPTSVITS_TEMPERATURE",))
    repetition_penalty: float = setting("REPETITION_PENALTY", defaults.REPETITION_PENALTY,
        _limits("repetition_penalty"), "GPT sampling: repetition penalty.", ("GPTSVITS_REPETITION_PENALTY",))
    speed_factor: float | None = setting("SPEED_FACTOR", None, _limits("speed_factor"),
        "Speech speed (unset: the voice's speed_factor, 1.1 for most zh presets). A JSON `speed` wins.",
        ("GPTSVITS_SPEED_FACTOR",))
    fragment_interval: float = setting("FRAGMENT_INTERVAL", defaults.FRAGMENT_INTERVAL, _limits("fragment_interval"),
        "Silence (s) between the sentences of one text.", ("GPTSVITS_FRAGMENT_INTERVAL",))
    text_split_method: str = setting("TEXT_SPLIT_METHOD", defaults.TEXT_SPLIT_METHOD, _choice(SPLIT_METHODS),
        "How a text is cut into sentences (cut0..cut5).", ("GPTSVITS_TEXT_SPLIT_METHOD",))
    seed: int = setting("SEED", defaults.SEED, _limits("seed"), "Sampling seed (-1: random).", ("GPTSVITS_SEED",))
    noise_scale: float = setting("NOISE_SCALE", defaults.NOISE_SCALE, _limits("noise_scale"), "SoVITS noise scale.",
        ("GPTSVITS_NOISE_SCALE",))
    streaming: bool = setting("STREAMING", False, _bool,
        "Send audio in chunks while the GPT still generates (else one `audio` message per text).",
        ("RETURN_FRAGMENT", "GPTSVITS_STREAMING"))
    stream_chunk_tokens: int | None = setting("STREAM_CHUNK_TOKENS", None, _limits("stream_chunk_tokens"),
        "Streaming: the most semantic tokens (40 ms of audio each) per chunk after the first (unset: the "
        "engine's 40); GPTSVITS_CHUNK_SIZE gives it in samples (1280 per token).", ("GPTSVITS_CHUNK_SIZE",),
        (("GPTSVITS_CHUNK_SIZE", _samples_to_tokens),), audience="tuning")
    stream_pace: bool = setting("PRIMESPEECH_STREAM_PACE", True, _bool,
        "Streaming: size the chunks from the measured speed so a stream keeps up once started; false: fixed "
        "steps (earliest first audio, gaps where the machine is slow).", ("GPTSVITS_STREAM_PACE",), audience="tuning")
    stream_start: str = setting("PRIMESPEECH_STREAM_START", "gapless", _choice(STREAM_STARTS),
        "Streaming's first chunk: gapless | earliest (sooner; later sentences may gap; docs/streaming.md).",
        audience="tuning")
    stream_max_wait: float = setting("PRIMESPEECH_STREAM_MAX_WAIT", 0.0, _ranged(_number, 0.0, 60.0),
        "Streaming: the longest (s) a listener waits for audio, for the first chunk or after running dry; the plan "
        "then spends an unavoidable wait in gaps of at most this instead of one wait before speaking. 0: off, every "
        "wait before speaking (docs/streaming.md).", (), audience="tuning")
    llm_text: bool = setting("PRIMESPEECH_LLM_TEXT", True, _bool,
        "Speak LLM output as prose: reasoning, tool calls and code unspoken (also across messages), markup "
        "as its words (docs/dataflow.md); false: the original's behaviour on raw text.", ("GPTSVITS_LLM_TEXT",))
    max_text_chars: int = setting("MAX_TEXT_CHARS", 5000, _ranged(_int, 1),
        "Longer `text` inputs are refused with an error (segment_complete `error`).", ("GPTSVITS_MAX_TEXT_CHARS",),
        audience="deployment")
    max_text_seconds: float = setting("MAX_TEXT_SECONDS", 30.0, _ranged(_number, 0.1),
        "Seconds the text front end may spend on one text (normalisation and phonemes); a text that needs more "
        "is answered with an error naming this limit (segment_complete `error`, stage `text`).", (),
        audience="deployment")
    segment_idle_s: float = setting("PRIMESPEECH_SEGMENT_IDLE_S", 3.0, _ranged(_number, 0.05),
        "Seconds without a fragment after which a streamed utterance (`segment_id`) ends as at `fin`.")
    max_fragment_chars: int = setting("PRIMESPEECH_MAX_FRAGMENT_CHARS", 5000, _ranged(_int, 1),
        "A longer fragment of a streamed utterance (`segment_id`) is left out (WARNING); its utterance is "
        "answered with an error naming this limit if nothing of it is spoken.", audience="deployment")
    max_held_chars: int = setting("PRIMESPEECH_MAX_HELD_CHARS", 20000, _ranged(_int, 1),
        "Characters of early fragments one streamed utterance holds while it waits for a missing `seq`; past "
        "this the gap is skipped (WARNING).", audience="deployment")
    max_intake_chars: int = setting("PRIMESPEECH_MAX_INTAKE_CHARS", 2_000_000, _ranged(_int, 1),
        "Characters of texts and fragments waiting in the node's intake; a text beyond it is answered at once "
        "with an error naming this limit (busy), a fragment beyond it is left out (WARNING, and its utterance's "
        "error if nothing of it is spoken).", audience="deployment")
    warmup: bool = setting("GPTSVITS_WARMUP", True, _bool, "Run one short synthesis at start.", ("WARMUP",),
        audience="tuning")
    reference_cache: bool = setting("PRIMESPEECH_REFERENCE_CACHE", True, _bool,
        "Keep each voice's reference features (CNHubert prompt tokens, the prompt's BERT features, the speaker "
        "embedding) in the folder `references` of PRIMESPEECH_CACHE_DIR, keyed by the content of the clip and the "
        "model files they come from: a restart with the same voice skips CNHubert and the prompt's BERT.",
        audience="tuning")
    prepared_cache: bool = setting("PRIMESPEECH_PREPARED_CACHE", True, _bool,
        "Keep each model whose load stores its weights in another form (RoBERTa's and the GPT's float32 weights "
        "as float16, CNHubert's float16 storage) in that form in the folder `prepared` of PRIMESPEECH_CACHE_DIR, "
        "keyed by the weights file and the runtime's choices: a restart reads it instead of converting again.",
        audience="tuning")
    auto_download: bool = setting("PRIMESPEECH_AUTO_DOWNLOAD", True, _bool,
        "Download a missing preset voice (and the encoders) from Hugging Face at start; false: fail with "
        "instructions instead.", ("GPTSVITS_AUTO_DOWNLOAD",), audience="deployment")
    device: str = setting("DEVICE", _RT.device, _DEVICE,
        "auto | cpu | gpu (cuda/mps/metal mean gpu). USE_GPU=true means gpu, false means cpu.",
        ("GPTSVITS_DEVICE", "USE_GPU", "GPTSVITS_USE_GPU"), (("USE_GPU", _use_gpu), ("GPTSVITS_USE_GPU", _use_gpu)),
        audience="tuning")
    encoders: str = setting("PRIMESPEECH_ENCODERS", _RT.encoders, _choice(CHOICES["encoders"]),
        "Encoder backend: auto (CoreML on macOS when available) | coreml | mlx. "
        "GPTSVITS_USE_ANE=true means auto, false means mlx.", ("GPTSVITS_ENCODERS", "GPTSVITS_USE_ANE"),
        (("GPTSVITS_USE_ANE", _use_ane),), audience="tuning")
    audio_format: str = setting("AUDIO_FORMAT", "list", _choice(("list", "flat")),
        "`audio` output form: list = pa.array([float32 samples]) (old node, ListArray of length 1); "
        "flat = pa.array(float32 samples) (dora-hub players).", ("GPTSVITS_AUDIO_FORMAT",))
    log_level: str = setting("LOG_LEVEL", "INFO", _choice(LOG_LEVELS, upper=True, synonyms={"WARN": "WARNING"}),
        "Lowest level sent on the `log` output.", ("GPTSVITS_LOG_LEVEL",))
    log_timing: bool = setting("GPTSVITS_LOG_TIMING", True, _bool,
        "Log each text's duration, real-time factor and stage times at INFO.", ("LOG_TIMING",), audience="tuning")
    num_threads: int | None = setting("NUM_THREADS", None, _ranged(_int, 1),
        "Accepted for old dataflows and checked; MLX chooses its own CPU threads.", (), audience="deployment")
    sample_rate: int | None = setting("SAMPLE_RATE", None, _ranged(_int, 1),
        "Informational: the rate comes from the model (32000). A different value logs a warning.", (),
        audience="deployment")
    silence_on_skip: bool = setting("SILENCE_ON_SKIP", True, _bool,
        "A skipped or failed text also gets a 50 ms silent `audio` (`silent: true`): players that advance per "
        "`audio` message never stall (not for texts cancelled by reset or stop).", ("GPTSVITS_SILENCE_ON_SKIP",))
    max_cached_voices: int = setting("PRIMESPEECH_VOICE_CACHE", 2, _ranged(_int, 0, 64),
        "Voices used by per-request `VOICE:` prefixes that stay loaded besides the current one (least recently "
        "used first out); 0 loads them for each request.", ("GPTSVITS_VOICE_CACHE",), audience="tuning")
    max_converted_models: int = setting("PRIMESPEECH_CONVERTED_CACHE", 8, _ranged(_int, 0, 10000),
        "Converted per-request (`VOICE:TRAINED`) checkpoints kept under <model dir>/mlx (least recently used "
        "out first).", ("GPTSVITS_CONVERTED_CACHE",), audience="deployment")
    max_queued_texts: int = setting("MAX_QUEUED_TEXTS", 1000, _ranged(_int, 1),
        "Texts waiting to be spoken; one more is answered at once with segment_complete `error` (busy), "
        "never dropped.", ("GPTSVITS_MAX_QUEUED_TEXTS",), audience="deployment")
    threads: int | str = setting("PRIMESPEECH_THREADS", "auto", _threads,
        "CPU threads (BLAS, float16 kernels, vocoder), the most PRIMESPEECH_THREAD_PLAN=adapt uses: a number, or "
        "auto (1 on machines with <= 2 usable CPUs, else every usable CPU). "
        "OPENBLAS_NUM_THREADS / MKL_NUM_THREADS set by the user are respected.", (), audience="tuning")
    thread_plan: str = setting("PRIMESPEECH_THREAD_PLAN", "adapt", _choice(("adapt", "fixed")),
        "adapt: at each request use only the cores free now (affinity mask, /proc/stat, CPU pressure), at most "
        "PRIMESPEECH_THREADS | fixed: always PRIMESPEECH_THREADS' count (threads.py).", (), audience="tuning")
    user_blas_threads: str | None = setting("OPENBLAS_NUM_THREADS", None, _str,
        "Read, never written: when set (or MKL_NUM_THREADS), PRIMESPEECH_THREADS=auto leaves the BLAS threads "
        "to it.", ("MKL_NUM_THREADS",), audience="deployment")
    preloaded_libraries: str | None = setting("LD_PRELOAD", None, _str,
        "Read, never written: a cblas_sgemm already loaded there is the BLAS PRIMESPEECH_BLAS reports.", (),
        audience="deployment")
    blas: str = setting("PRIMESPEECH_BLAS", "auto", _str,
        "CPU BLAS for MLX on Linux, loaded before MLX: auto (pip MKL, system OpenBLAS, numpy's OpenBLAS via a "
        "shim) | off | the path of a library exporting cblas_sgemm (importing `mlx` first: a warning).", (),
        audience="tuning")
    conv_impl: str = setting("PRIMESPEECH_CONV_IMPL", _RT.conv_impl, _choice(CHOICES["conv_impl"]),
        "SoVITS convolutions: auto (GEMM on the CPU, MLX's conv on GPUs) | gemm | native.", (), audience="tuning")
    t2s_decode: str = setting("PRIMESPEECH_T2S_DECODE", _RT.t2s_decode, _choice(CHOICES["t2s_decode"]),
        "GPT decode step, chosen when the GPT loads: auto (numpy on the CPU, MLX on GPUs) | mlx | compile "
        "(mx.compile'd MLX step) | numpy.", (), audience="tuning")
    t2s_compile: bool | None = setting("PRIMESPEECH_T2S_COMPILE", _RT.t2s_compile, _auto_bool,
        "Compile the MLX GPT decode step with mx.compile: auto (on GPUs only) | 1 | 0.", (), audience="tuning")
    bert_half: bool | None = setting("PRIMESPEECH_BERT_HALF", _RT.bert_half, _auto_bool,
        "RoBERTa weights in float16 (float32 compute; ~0.55 GB less memory): auto (on where MLX runs on the CPU and "
        "the float16 kernels build, when the weights are float16 values, as released) | 1 | 0.", (), audience="tuning")
    vocoder: str = setting("PRIMESPEECH_VOCODER", _RT.vocoder, _choice(CHOICES["vocoder"]),
        "SoVITS vocoder (generator) backend: auto (ONNX Runtime when MLX runs on the CPU, else MLX) | onnx | "
        "openvino (extra `openvino`; else ONNX Runtime) | mlx. A runtime failure falls back to MLX, one warning.", (),
        audience="tuning")
    vocoder_parts: str = setting("PRIMESPEECH_VOCODER_PARTS", _RT.vocoder_parts, _choice(CHOICES["vocoder_parts"]),
        "ONNX Runtime vocoder cut into this many stretches run at once, one thread each (same samples; latents "
        "under 4 receptive fields a part run whole): auto (2 at PRIMESPEECH_THREADS=2, else 1) | 1 | N.", (),
        audience="tuning")
    vocoder_spin: bool | None = setting("PRIMESPEECH_VOCODER_SPIN", _RT.vocoder_spin, _auto_bool,
        "ONNX Runtime vocoder's threads spin between convolutions: auto (off) | 1 | 0.", (), audience="tuning")
    batch: int = setting("PRIMESPEECH_BATCH", 4, _ranged(_int, 1, 16),
        "Sentences decoded together by the GPT (continuous batching: a request's later sentences and the texts "
        "queued behind it, same voice, join the running decode; each keeps its own tokens): rows "
        "per step, 1 = one after another.", (), audience="tuning")
    overlap: str = setting("PRIMESPEECH_OVERLAP", _RT.overlap, _choice(CHOICES["overlap"]),
        "ONNX Runtime vocoder on a thread beside the GPT: auto (at >= 2 threads) | 1 | 0.", (), audience="tuning")
    gpt_half: str = setting("PRIMESPEECH_GPT_HALF", _RT.gpt_half,
        _choice(CHOICES["gpt_half"], synonyms={"true": "1", "on": "1", "yes": "1", "false": "0", "off": "0",
                                              "no": "0"}),
        "GPT decode step on the CPU with float16 weights, float32 accumulation (C kernel): auto (when the "
        "weights are float16 values, as released) | 1 | 0.", (), audience="tuning")
    isa: str = setting("PRIMESPEECH_ISA", _RT.isa, _choice(CHOICES["isa"]),
        "Build of the float16-weight C kernels: auto (avx512 or avx2 by the CPU's flags; none elsewhere) | avx512 | "
        "avx2 | generic (portable C) | none (numpy float32 / MLX). A build the CPU cannot run is refused.", (),
        audience="tuning")
    precision: str = setting("PRIMESPEECH_PRECISION", _RT.precision, _choice(CHOICES["precision"]),
        "Reduced precision on the CPU, opt-in (changes the output; fidelity in docs/performance.md): exact | int8 "
        "(GPT decode step's weights rounded to int8 per row: half the bytes per token; AVX-512 kernels) | bf16 "
        "(vocoder on OpenVINO in bfloat16; CPUs with AVX-512 BF16 or AMX) | int8_bf16. Where the CPU or the "
        "extra lacks it: exact, one INFO line.", (), audience="tuning")
    gpt_prefill: str = setting("PRIMESPEECH_GPT_PREFILL", _RT.gpt_prefill, _choice(CHOICES["gpt_prefill"]),
        "GPT prefill with float16 weights on the CPU: float16 (kernel GEMM) | float32 (upcast, BLAS) | auto (the "
        "faster measured for this build and thread count; bench prints it).", (), audience="tuning")
    bert_gemm: str = setting("PRIMESPEECH_BERT_GEMM", _RT.bert_gemm, _choice(CHOICES["bert_gemm"]),
        "RoBERTa with float16 weights on the CPU: float16 (kernel GEMM) | float32 (upcast per call, BLAS) | auto "
        "(the faster measured for this build).", (), audience="tuning")
    g2pw: bool = setting("PRIMESPEECH_G2PW", False, _bool,
        "Chinese polyphones by g2pW (onnxruntime, <model dir>/G2PWModel) instead of pypinyin.", (),
        audience="deployment")
    g2pw_vocab: Path | None = setting("PRIMESPEECH_G2PW_VOCAB", None, _path,
        "g2pW's BERT vocabulary file (unset: vocab.txt in the G2PWModel folder).", (), audience="deployment")
    coreml_compute_units: str = setting("PRIMESPEECH_COREML_COMPUTE_UNITS", _RT.coreml_compute_units,
        _choice(CHOICES["coreml_compute_units"], upper=True), "CoreML compute units on macOS.", (), audience="tuning")
    dora_sends: str = setting("PRIMESPEECH_DORA_SENDS", "auto", _choice(("auto", "worker", "main")),
        "Thread calling send_output: auto (main on dora-rs 0.3, else worker) | worker | main", (),
        audience="deployment")
    dora_node_config: str | None = setting("DORA_NODE_CONFIG", None, _str,
        "Read, never written: set by the dora daemon that spawned the node, which then exits (code 1) within a "
        "second of that daemon going away.", (), audience="deployment")
    voices_dir: Path | None = setting("PRIMESPEECH_VOICES_DIR", None, _path,
        "An extra folder of user voice YAML files; by default per-request voices may also read the files in it "
        "(PRIMESPEECH_REQUEST_PATHS).", (), audience="deployment")
    voice_unknown_keys: str = setting("PRIMESPEECH_VOICE_UNKNOWN_KEYS", "error", _choice(("error", "warn")),
        "Unknown voice YAML keys: error (the file is listed as broken, docs/voices.md) | warn.", (),
        audience="deployment")
    request_paths: tuple[Path, ...] | str | None = setting("PRIMESPEECH_REQUEST_PATHS", None, _folders,
        "Folders `VOICE:CUSTOM` / `VOICE:TRAINED` may read, `:`-separated (unset: the model directory and "
        "PRIMESPEECH_VOICES_DIR; `*`: any file). Message paths are literal (docs/security.md).", (),
        audience="deployment")
    text_data: Path | None = setting("PRIMESPEECH_TEXT_DATA", None, _path,
        "Folder with the original front end's dictionaries (unset: <model dir>/text-data, filled on first "
        "use).", (), audience="deployment")
    cache_dir: Path = setting("PRIMESPEECH_CACHE_DIR", expand("~/.cache/dora_primespeech_mlx"), _path,
        "Cache for the compiled BLAS shim, the text front end's prepared dictionaries (text/), the voices' "
        "reference features (references/), the models' prepared weights (prepared/) and the benchmark's models "
        "(XDG_CACHE_HOME/dora_primespeech_mlx when only that is set).", ("XDG_CACHE_HOME",),
        (("XDG_CACHE_HOME", _cache_under),), audience="deployment")
    zenoh_overlay: Path | None = setting("DORA_ZENOH_CONFIG_OVERLAY", None, _path,
        "dora 1.x's Zenoh config overlay (read by dora); unset (and no ZENOH_CONFIG): the node applies the "
        "packaged zenoh-overlay.json5 to its own outputs.", (), audience="deployment")
    zenoh_config: Path | None = setting("ZENOH_CONFIG", None, _path,
        "A whole Zenoh config file for dora (read by dora; when set the node adds no overlay).", (),
        audience="deployment")
    cc: str | None = setting("CC", None, _str,
        "C compiler used to build the BLAS shim and the float16 kernels (unset: cc, gcc or clang on PATH).", (),
        audience="deployment")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read every setting from ``env`` (default ``os.environ``); one ConfigError lists all bad ones."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        errors: list[str] = []
        for var in VARS:
            try:
                found = _lookup(var, env)
            except ValueError as exc:
                errors.append(str(exc))
                continue
            if found is not None:
                values[var.field] = found[0]
        if errors:
            raise ConfigError("invalid environment variable(s) for dora-primespeech-mlx:\n  " + "\n  ".join(errors))
        return cls(**values)

    def sampling(self) -> dict[str, Any]:
        """Per-request synthesis parameters for the engine (``SynthesisConfig`` field names)."""
        out = {f.name: getattr(self, f.name) for f in fields(defaults.RequestDefaults) if f.name != "speed_factor"}
        if self.speed_factor is not None:
            out["speed_factor"] = self.speed_factor
        if self.stream_chunk_tokens is not None:
            out["stream_chunk_tokens"] = self.stream_chunk_tokens
        out["stream_pace"] = self.stream_pace
        return out


VARS: tuple[Var, ...] = tuple(
    Var(f.name, f.metadata["setting"]["name"], f.default,
        **{k: v for k, v in f.metadata["setting"].items() if k not in ("name", "order")})
    for f in sorted((f for f in fields(Settings) if "setting" in f.metadata),
                    key=lambda f: f.metadata["setting"]["order"]))


def _lookup(var: Var, env: Mapping[str, str]) -> tuple[Any] | None:
    """(value,) from the first of ``var``'s names set in ``env``, or None; ValueError names a bad value."""
    for name in var.names:
        raw = env.get(name)
        if raw is None or str(raw).strip() == "":
            continue
        try:
            return (var.parser(name)(str(raw)),)
        except ValueError as exc:
            raise ValueError(f"{name}={raw!r}: {exc}") from None
    return None


_BY_FIELD = {v.field: v for v in VARS}


def read(field: str, env: Mapping[str, str] | None = None) -> Any:
    """One setting from the environment (its default when unset); a bad value raises ConfigError naming it.
    For entry points that need one value without validating the whole environment."""
    var = _BY_FIELD[field]
    try:
        found = _lookup(var, os.environ if env is None else env)
    except ValueError as exc:
        raise ConfigError(f"invalid environment variable for dora-primespeech-mlx: {exc}") from None
    return var.default if found is None else found[0]


PROCESS_FIELDS = ("threads", "user_blas_threads", "preloaded_libraries", "blas", "cache_dir", "cc")


def process_setting(field: str) -> Any:
    """One of the process-wide settings (:data:`PROCESS_FIELDS`: the CPU BLAS and its threads, where and with which
    compiler native code is built), read from the environment when asked. They hold for the whole process, not for
    an engine: the BLAS is loaded into the global symbol scope before MLX loads, at import (``_blas``)."""
    if field not in PROCESS_FIELDS:
        raise KeyError(f"{field!r} is not a process-wide setting ({', '.join(PROCESS_FIELDS)})")
    return read(field)


ZENOH_OVERLAY = Path(__file__).resolve().with_name("zenoh-overlay.json5")


def child_env(**overrides: str) -> dict[str, str]:
    """The environment for a child process (benchmark runners): this process's, with ``overrides``."""
    return {**os.environ, **overrides}


def use_reliable_zenoh(settings: Settings) -> Path | None:
    """Before ``dora.Node()``: give this process dora's Zenoh overlay (see zenoh-overlay.json5) unless the user
    configured Zenoh. The one place the package writes an environment variable, read by dora's node API in
    this process only. Returns the overlay in force (None when ZENOH_CONFIG rules)."""
    if settings.zenoh_overlay is not None or settings.zenoh_config is not None:
        return settings.zenoh_overlay
    os.environ["DORA_ZENOH_CONFIG_OVERLAY"] = str(ZENOH_OVERLAY)
    return ZENOH_OVERLAY


def describe(audience: str | None = None) -> list[tuple[str, tuple[str, ...], Any, str]]:
    """``(name, aliases, default, meaning)`` for every setting of ``audience`` (None: all), in the order of
    :data:`VARS` (the model directory's default is shown unexpanded, ``~/.dora/models/primespeech``; an automatic
    on/off switch, unset by default, as ``auto``)."""
    if audience is not None and audience not in AUDIENCES:
        raise ValueError(f"audience {audience!r}: expected one of {', '.join(AUDIENCES)}")
    shown = {"model_dir": DEFAULT_MODEL_DIR, "cache_dir": "~/.cache/dora_primespeech_mlx"}
    shown.update({v.field: "auto" for v in VARS if v.parse is _auto_bool and v.default is None})
    return [(v.name, v.aliases, shown.get(v.field, v.default), v.meaning) for v in VARS
            if audience in (None, v.audience)]
