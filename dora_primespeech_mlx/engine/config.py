"""Request settings and results: :class:`SynthesisConfig` (the old node's defaults, validated against the
one range table in :mod:`dora_primespeech_mlx.defaults`), :class:`SynthesisResult` (a whole request) and
:class:`AudioChunk` (one streamed piece). Plain data; nothing here touches a model."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import defaults
from ..errors import ConfigError

TEXT_SPLIT_METHODS = defaults.TEXT_SPLIT_METHODS


@dataclass(frozen=True)
class SynthesisConfig(defaults.RequestDefaults):
    """Per-request settings. ``None`` takes the voice's value. Defaults are the old node's wrapper's
    (:class:`~dora_primespeech_mlx.defaults.RequestDefaults`)."""

    text_lang: str | None = None
    prompt_lang: str | None = None
    # streaming (synthesize_stream only)
    # 12: first audio after 12 tokens (8 of them emitted, 0.3 s): earlier than 16 gives, and a first piece closer to
    # the whole decode than 8 gives (docs/streaming.md#the-first-windows-size)
    stream_first_tokens: int = 12
    stream_chunk_tokens: int = 40
    stream_ramp: float = 1.5  # later windows grow by this factor from stream_first_tokens to stream_chunk_tokens
    stream_context_tokens: int = 16
    stream_lookahead_tokens: int = 4
    stream_crossfade_ms: float = 15.0
    # latent frames a window's vocoder run gets before the audio it emits (its left context; the lookahead tokens
    # give the right one). The generator's receptive field (13 frames for v2) or more: the same samples as
    # vocoding the whole window; 5: a relative L2 of ~1.3e-5 from that (under 1 % of what windowing changes on the
    # real-size set, docs/streaming.md "The vocoder margin"), each window 6 frames of vocoder cheaper than at 8
    stream_vocoder_margin: int = 5
    # pace the windows by the measured speeds (engine/pacing.py): a first window large enough that the stream
    # keeps up where the machine is slow, later windows cut just in time; False: the fixed steps above
    stream_pace: bool = True
    # the LLM text stage (text/llm/) on the text before the front end; None: the engine's settings
    # (PRIMESPEECH_LLM_TEXT). The node passes False: its per-session stream filter has cleaned the text already
    llm_text: bool | None = None

    def __post_init__(self) -> None:
        self.validate()

    def replace(self, **overrides: Any) -> SynthesisConfig:
        """A copy with ``overrides`` applied and validated (:class:`ConfigError` on a bad value)."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ConfigError(f"unknown synthesis setting(s) {unknown}; known: {sorted(names)}")
        return dataclasses.replace(self, **overrides)

    def validate(self) -> None:
        def fail(name: str, rule: str) -> None:
            raise ConfigError(f"synthesis setting {name}={getattr(self, name)!r} is invalid: {rule}")

        for name in ("text_lang", "prompt_lang"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v.strip()):
                fail(name, "must be a language code such as 'zh' or 'en', or None for the voice's")
        for name, rng in defaults.RANGES.items():
            value = getattr(self, name)
            if value is None and name == "speed_factor":
                continue
            ok = _is_int(value) if rng.integer else _is_num(value)
            if not ok or not rng.contains(value):
                extra = ", or None for the voice's" if name == "speed_factor" else ""
                extra = ", or -1 for a random seed" if name == "seed" else extra
                fail(name, rng.describe() + extra)
        if not isinstance(self.stream_pace, (bool, np.bool_)):
            fail("stream_pace", "must be true or false")
        if self.llm_text is not None and not isinstance(self.llm_text, (bool, np.bool_)):
            fail("llm_text", "must be true, false or None for the engine's setting")
        if self.text_split_method not in TEXT_SPLIT_METHODS:
            fail("text_split_method", f"must be one of {', '.join(TEXT_SPLIT_METHODS)}")


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass
class SynthesisResult:
    audio: np.ndarray  # float32, 1-D, in [-1, 1]
    sample_rate: int
    duration: float
    semantic_tokens: np.ndarray  # all chunks' generated tokens, concatenated
    timings: dict[str, float]
    voice: str


@dataclass
class AudioChunk:
    audio: np.ndarray  # float32, 1-D
    sample_rate: int
    chunk_index: int  # running index over the request
    is_final: bool  # last chunk of the request
    sentence_index: int  # which text chunk it belongs to
    duration: float
    # the span of the request's text (after the engine's LLM stage, if on) whose audio this chunk starts: a
    # sentence's first chunk carries the sentence's span (text.spans.piece_spans; with any sentence before it that
    # gave no audio), its later chunks an empty span at its end; the spans of a request's chunks tile its text
    text_start: int = 0
    text_end: int = 0
    sentence_end: bool = False  # the last chunk of its sentence
