"""The node's settings: one dataclass read from the environment.

Every setting has one primary name (the old dora-primespeech node's name where it had one, so existing
dataflows keep working) and optional aliases (the design document's ``GPTSVITS_*`` names and a few
others). **Precedence: the primary name, then the aliases in the order listed, then the default.** An
empty value counts as unset (old dataflows write ``PRIMESPEECH_MODEL_DIR: ""``).

Dora passes ``env:`` values as strings: YAML ``1.0`` arrives as ``"1"``, ``false`` as ``"false"``. Every
value is parsed and checked here; all bad variables are reported together in one :class:`ConfigError`
when the node starts. Nothing is overridden behind the user's back: TOP_K, TOP_P, TEMPERATURE, SEED, ...
reach the engine as given (the old node's wrapper silently replaced them).

:func:`describe` lists every setting as ``(name, aliases, default, meaning)`` rows, from which the README
table is written.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from . import defaults
from .errors import ConfigError
from .paths import DEFAULT_MODEL_DIR, expand

# Languages the old node accepted for TEXT_LANG / PROMPT_LANG. The engine refuses the ones it cannot
# speak (ja, ko, yue, ...) with a clear error when the voice is loaded.
OLD_LANGS = ("auto", "auto_yue", "en", "zh", "ja", "yue", "ko", "all_zh", "all_ja", "all_yue", "all_ko")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
SPLIT_METHODS = ("cut0", "cut1", "cut2", "cut3", "cut4", "cut5")
SAMPLES_PER_TOKEN = 640  # 32 kHz audio, 50 semantic tokens per second

_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f"}


# ---------------------------------------------------------------------------------------------------
# Parsers: str -> value, raising ValueError with a short reason.


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


def _path(s: str) -> Path:
    return expand(s.strip())


def _use_gpu(s: str) -> str:
    return "gpu" if _bool(s) else "cpu"


def _use_ane(s: str) -> str:
    return "auto" if _bool(s) else "mlx"


def _samples_to_tokens(s: str) -> int:
    samples = _ranged(_int, 1)(s)
    return min(1500, max(1, round(samples / SAMPLES_PER_TOKEN)))


_DEVICE = _choice(("auto", "cpu", "gpu"), synonyms={"cuda": "gpu", "mps": "gpu", "metal": "gpu"})
_LANG = _choice(OLD_LANGS)


@dataclass(frozen=True)
class Var:
    """One setting: field name, primary env name, aliases (each with its own parser when it differs)."""

    field: str
    name: str
    default: Any
    parse: Callable[[str], Any]
    meaning: str
    aliases: tuple[str, ...] = ()
    alias_parse: tuple[tuple[str, Callable[[str], Any]], ...] = ()

    def parser(self, env_name: str) -> Callable[[str], Any]:
        return dict(self.alias_parse).get(env_name, self.parse)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


VARS: tuple[Var, ...] = (
    Var("voice", "VOICE_NAME", "Doubao", _str,
        "Voice at start: a preset (`primespeech-mlx voices`) or a user voice YAML name.",
        ("GPTSVITS_VOICE",)),
    Var("model_dir", "PRIMESPEECH_MODEL_DIR", expand(DEFAULT_MODEL_DIR), _path,
        "Model directory (old node layout; `~` and `$VAR` are expanded).", ("GPTSVITS_MODEL_DIR",)),
    Var("text_lang", "TEXT_LANG", None, _LANG,
        "Language of the text for the start voice (unset: the voice's language). After `change_voice` "
        "or a `VOICE:` prefix the language follows the new voice.", ("GPTSVITS_TEXT_LANG",)),
    Var("prompt_lang", "PROMPT_LANG", None, _LANG,
        "Language of the start voice's reference transcript (unset: the voice's).",
        ("GPTSVITS_PROMPT_LANG",)),
    Var("prompt_text", "PROMPT_TEXT", None, _str,
        "Transcript of the start voice's reference clip (unset: the voice's).", ("GPTSVITS_PROMPT_TEXT",)),
    Var("top_k", "TOP_K", defaults.TOP_K, _ranged(_int, 1), "GPT sampling: top-k.", ("GPTSVITS_TOP_K",)),
    Var("top_p", "TOP_P", defaults.TOP_P, _ranged(_number, 0.0, 1.0, lo_open=True), "GPT sampling: top-p.",
        ("GPTSVITS_TOP_P",)),
    Var("temperature", "TEMPERATURE", defaults.TEMPERATURE, _ranged(_number, 0.0, lo_open=True),
        "GPT sampling temperature.",
        ("GPTSVITS_TEMPERATURE",)),
    Var("repetition_penalty", "REPETITION_PENALTY", defaults.REPETITION_PENALTY, _ranged(_number, 0.0, lo_open=True),
        "GPT sampling: repetition penalty.", ("GPTSVITS_REPETITION_PENALTY",)),
    Var("speed_factor", "SPEED_FACTOR", None, _ranged(_number, 0.0, 4.0, lo_open=True),
        "Speech speed (unset: the voice's speed_factor, 1.1 for most zh presets). A JSON `speed` wins.",
        ("GPTSVITS_SPEED_FACTOR",)),
    Var("fragment_interval", "FRAGMENT_INTERVAL", defaults.FRAGMENT_INTERVAL, _ranged(_number, 0.0),
        "Silence (s) between the sentences of one text.", ("GPTSVITS_FRAGMENT_INTERVAL",)),
    Var("text_split_method", "TEXT_SPLIT_METHOD", defaults.TEXT_SPLIT_METHOD, _choice(SPLIT_METHODS),
        "How one text is cut into sentences (upstream cut0..cut5).", ("GPTSVITS_TEXT_SPLIT_METHOD",)),
    Var("seed", "SEED", defaults.SEED, _ranged(_int, -1), "Sampling seed (-1: random).", ("GPTSVITS_SEED",)),
    Var("noise_scale", "NOISE_SCALE", defaults.NOISE_SCALE, _ranged(_number, 0.0), "SoVITS noise scale.",
        ("GPTSVITS_NOISE_SCALE",)),
    Var("streaming", "STREAMING", False, _bool,
        "Send audio in chunks while the GPT still generates (else one `audio` message per text).",
        ("RETURN_FRAGMENT", "GPTSVITS_STREAMING")),
    Var("stream_chunk_tokens", "STREAM_CHUNK_TOKENS", None, _ranged(_int, 1, 1500),
        "Streaming: semantic tokens (50 per second of audio) per audio chunk after the first "
        "(unset: the engine's default). GPTSVITS_CHUNK_SIZE gives it in samples (640 per token).",
        ("GPTSVITS_CHUNK_SIZE",), (("GPTSVITS_CHUNK_SIZE", _samples_to_tokens),)),
    Var("max_text_chars", "MAX_TEXT_CHARS", 5000, _ranged(_int, 1),
        "Longer `text` inputs are refused with an error (segment_complete `error`).",
        ("GPTSVITS_MAX_TEXT_CHARS",)),
    Var("warmup", "GPTSVITS_WARMUP", True, _bool, "Run one short synthesis at start.", ("WARMUP",)),
    Var("auto_download", "PRIMESPEECH_AUTO_DOWNLOAD", True, _bool,
        "Download a missing preset voice (and the encoders) from Hugging Face at start; false: fail with "
        "instructions instead.", ("GPTSVITS_AUTO_DOWNLOAD",)),
    Var("device", "DEVICE", "auto", _DEVICE,
        "auto | cpu | gpu (cuda/mps/metal mean gpu). USE_GPU=true means gpu, false means cpu.",
        ("GPTSVITS_DEVICE", "USE_GPU", "GPTSVITS_USE_GPU"),
        (("USE_GPU", _use_gpu), ("GPTSVITS_USE_GPU", _use_gpu))),
    Var("encoders", "PRIMESPEECH_ENCODERS", "auto", _choice(("auto", "coreml", "mlx")),
        "Encoder backend: auto (CoreML on macOS when available) | coreml | mlx. "
        "GPTSVITS_USE_ANE=true means auto, false means mlx.",
        ("GPTSVITS_ENCODERS", "GPTSVITS_USE_ANE"), (("GPTSVITS_USE_ANE", _use_ane),)),
    Var("vocoder", "PRIMESPEECH_VOCODER", "auto", _choice(("auto", "onnx", "mlx")),
        "SoVITS vocoder (generator) backend: auto (ONNX Runtime when MLX runs on the CPU, else MLX) | onnx | "
        "mlx. Any ONNX Runtime failure falls back to MLX with one warning.", ()),
    Var("audio_format", "AUDIO_FORMAT", "list", _choice(("list", "flat")),
        "`audio` output form: list = pa.array([float32 samples]) (old node, ListArray of length 1); "
        "flat = pa.array(float32 samples) (dora-hub players).", ("GPTSVITS_AUDIO_FORMAT",)),
    Var("log_level", "LOG_LEVEL", "INFO", _choice(LOG_LEVELS, upper=True, synonyms={"WARN": "WARNING"}),
        "Lowest level sent on the `log` output.", ("GPTSVITS_LOG_LEVEL",)),
    Var("log_timing", "GPTSVITS_LOG_TIMING", True, _bool,
        "Log the duration, real-time factor and stage timings of every text at INFO.", ("LOG_TIMING",)),
    Var("num_threads", "NUM_THREADS", None, _ranged(_int, 1),
        "Accepted for old dataflows and checked; MLX chooses its own CPU threads.", ()),
    Var("sample_rate", "SAMPLE_RATE", None, _ranged(_int, 1),
        "Informational: the rate comes from the model (32000). A different value logs a warning.", ()),
)


@dataclass(frozen=True)
class Settings:
    """The node's configuration. Build it with :meth:`from_env`; see :data:`VARS` for the meanings."""

    voice: str = "Doubao"
    model_dir: Path = expand(DEFAULT_MODEL_DIR)
    text_lang: str | None = None
    prompt_lang: str | None = None
    prompt_text: str | None = None
    top_k: int = defaults.TOP_K
    top_p: float = defaults.TOP_P
    temperature: float = defaults.TEMPERATURE
    repetition_penalty: float = defaults.REPETITION_PENALTY
    speed_factor: float | None = None
    fragment_interval: float = defaults.FRAGMENT_INTERVAL
    text_split_method: str = defaults.TEXT_SPLIT_METHOD
    seed: int = defaults.SEED
    noise_scale: float = defaults.NOISE_SCALE
    streaming: bool = False
    stream_chunk_tokens: int | None = None
    max_text_chars: int = 5000
    warmup: bool = True
    auto_download: bool = True
    device: str = "auto"
    encoders: str = "auto"
    vocoder: str = "auto"
    audio_format: str = "list"
    log_level: str = "INFO"
    log_timing: bool = True
    num_threads: int | None = None
    sample_rate: int | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read every setting from ``env`` (default ``os.environ``); one ConfigError lists all bad ones."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        errors: list[str] = []
        for var in VARS:
            for name in var.names:
                raw = env.get(name)
                if raw is None or str(raw).strip() == "":
                    continue
                try:
                    values[var.field] = var.parser(name)(str(raw))
                except ValueError as exc:
                    errors.append(f"{name}={raw!r}: {exc}")
                break
        if errors:
            raise ConfigError("invalid environment variable(s) for dora-primespeech-mlx:\n  " + "\n  ".join(errors))
        return cls(**values)

    def sampling(self) -> dict[str, Any]:
        """Per-request synthesis parameters for the engine (``SynthesisConfig`` field names)."""
        out = {
            "top_k": self.top_k,
            "top_p": self.top_p,
            "temperature": self.temperature,
            "repetition_penalty": self.repetition_penalty,
            "fragment_interval": self.fragment_interval,
            "text_split_method": self.text_split_method,
            "seed": self.seed,
            "noise_scale": self.noise_scale,
        }
        if self.speed_factor is not None:
            out["speed_factor"] = self.speed_factor
        if self.stream_chunk_tokens is not None:
            out["stream_chunk_tokens"] = self.stream_chunk_tokens
        return out

    def as_dict(self) -> dict[str, Any]:
        return {f.name: (str(v) if isinstance(v := getattr(self, f.name), Path) else v) for f in fields(self)}


def describe() -> list[tuple[str, tuple[str, ...], Any, str]]:
    """``(name, aliases, default, meaning)`` for every setting, in the order of :data:`VARS`
    (the model directory's default is shown unexpanded, ``~/.dora/models/primespeech``)."""
    return [(v.name, v.aliases, DEFAULT_MODEL_DIR if v.field == "model_dir" else v.default, v.meaning)
            for v in VARS]
