"""The synthesis engine: voice -> reference features -> text -> GPT -> SoVITS -> audio.

One :class:`GPTSoVITSEngine` holds the loaded models (cached per file), the reference side of every
voice it has seen (prompt semantic tokens, ``ge``, prompt phones and BERT; cached per voice, prompt
and file mtimes) and the request defaults (:class:`SynthesisConfig`, the old node's values). It
reproduces upstream ``TTS.run`` (gpt-sovits-v2.md §8) with these choices:

- Every text chunk is generated and SoVITS-decoded on its own (``batch_size`` 1, as the dora fork
  does for its 1.1x voices, §10). With ``speed_factor`` 1 this equals upstream's bucketed decode
  only when a bucket holds one chunk (the fixture's e2e case); decoding per chunk keeps the chunks
  independent, which streaming needs, and the audio of one chunk never depends on its neighbours.
- The GPT follows upstream HEAD (the first generated token is kept; the dora fork dropped it).
- Randomness is reproducible: the GPT sampler of chunk ``i`` is seeded with ``seed + i`` and the
  SoVITS prior noise comes from a per-chunk noise bank indexed by output frame, so a streamed
  request and a whole one draw the same noise for the same frame. ``seed=-1`` picks a seed.
- :meth:`GPTSoVITSEngine.synthesize_stream` yields audio while the GPT is still generating: after
  ``stream_first_tokens`` tokens, then every ``stream_chunk_tokens``, SoVITS decodes a window of the
  tokens so far starting ``stream_context_tokens`` before the emitted audio, keeps only the new
  samples (the last ``stream_lookahead_tokens`` wait for their right context) and crossfades each
  seam over ``stream_crossfade_ms`` (raised cosine). With ``speed_factor`` != 1 every window is
  interpolated onto one output-frame grid with the nominal ratio (the whole-sentence decode uses
  upstream's ``int(2T/speed)+1`` frames, whose ratio depends on T; the two differ by under a frame
  over a sentence).
- Audio is float32 in [-1, 1]: SoVITS ends in tanh, so upstream's per-fragment ``/max`` never
  changes it; each chunk is followed by ``fragment_interval`` seconds of silence.
- One re-entrant lock serialises model use; streams take it per token and per decode, so a stream
  consumed in one thread and a request from another interleave safely.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from . import defaults
from . import voices as voices_mod
from .errors import ConfigError, NothingToSpeakError, PrimeSpeechError, SynthesisCancelled, SynthesisError
from .paths import model_dir as default_model_dir
from .text.errors import TextFrontendError
from .voices import VoiceSpec

TEXT_SPLIT_METHODS = ("cut0", "cut1", "cut2", "cut3", "cut4", "cut5")
REF_MIN_SECONDS, REF_MAX_SECONDS = 3.0, 10.0  # upstream: 48000 <= len(wav16k) <= 160000
HUBERT_SR = 16000
BERT_DIM = 1024  # the GPT's bert_proj input width (chinese-roberta-wwm-ext-large)
NOISE_BLOCK_FRAMES = 256
ENCODER_MODES = ("auto", "coreml", "mlx")
_WORD_RE = re.compile(r"[^\W_]")  # something speakable: a letter or a digit of any script


# ---------------------------------------------------------------------------------------------------
# Request configuration and results
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SynthesisConfig:
    """Per-request settings. ``None`` takes the voice's value. Defaults are the old node's wrapper's."""

    text_lang: str | None = None
    prompt_lang: str | None = None
    top_k: int = defaults.TOP_K
    top_p: float = defaults.TOP_P
    temperature: float = defaults.TEMPERATURE
    repetition_penalty: float = defaults.REPETITION_PENALTY
    speed_factor: float | None = None
    fragment_interval: float = defaults.FRAGMENT_INTERVAL
    seed: int = defaults.SEED
    text_split_method: str = defaults.TEXT_SPLIT_METHOD
    noise_scale: float = defaults.NOISE_SCALE
    # streaming (synthesize_stream only)
    # 12: first audio after 12 tokens (8 of them emitted, 0.3 s); bench VM TTFA 2.14 s at 16, 1.79 s at 12,
    # 1.51 s at 8, where the first piece (0.15 s) differs most from the whole decode (rel. L2 0.26 vs 0.18)
    stream_first_tokens: int = 12
    stream_chunk_tokens: int = 40
    stream_context_tokens: int = 16
    stream_lookahead_tokens: int = 4
    stream_crossfade_ms: float = 15.0

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

        def is_int(v: Any) -> bool:
            return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

        def is_num(v: Any) -> bool:
            return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) and math.isfinite(v)

        for name in ("text_lang", "prompt_lang"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v.strip()):
                fail(name, "must be a language code such as 'zh' or 'en', or None for the voice's")
        if not is_int(self.top_k) or not 1 <= self.top_k <= 1024:
            fail("top_k", "must be an integer in 1..1024")
        if not is_num(self.top_p) or not 0 < self.top_p <= 1:
            fail("top_p", "must be a number in (0, 1]")
        if not is_num(self.temperature) or not 0 < self.temperature <= 10:
            fail("temperature", "must be a number in (0, 10]")
        if not is_num(self.repetition_penalty) or not 0 < self.repetition_penalty <= 10:
            fail("repetition_penalty", "must be a number in (0, 10]")
        if self.speed_factor is not None and (not is_num(self.speed_factor) or not 0.25 <= self.speed_factor <= 4):
            fail("speed_factor", "must be a number in 0.25..4, or None for the voice's")
        if not is_num(self.fragment_interval) or not 0 <= self.fragment_interval <= 10:
            fail("fragment_interval", "must be a number of seconds in 0..10")
        if not is_int(self.seed) or not -1 <= self.seed < 2**32:
            fail("seed", "must be an integer in 0..2**32-1, or -1 for a random seed")
        if self.text_split_method not in TEXT_SPLIT_METHODS:
            fail("text_split_method", f"must be one of {', '.join(TEXT_SPLIT_METHODS)}")
        if not is_num(self.noise_scale) or not 0 <= self.noise_scale <= 10:
            fail("noise_scale", "must be a number in 0..10")
        for name in ("stream_first_tokens", "stream_chunk_tokens"):
            if not is_int(getattr(self, name)) or not 1 <= getattr(self, name) <= 1500:
                fail(name, "must be an integer in 1..1500")
        for name in ("stream_context_tokens", "stream_lookahead_tokens"):
            if not is_int(getattr(self, name)) or not 0 <= getattr(self, name) <= 1500:
                fail(name, "must be an integer in 0..1500")
        if not is_num(self.stream_crossfade_ms) or not 0 <= self.stream_crossfade_ms <= 40:
            fail("stream_crossfade_ms", "must be a number of milliseconds in 0..40 (at most one token)")


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


# ---------------------------------------------------------------------------------------------------
# Internal data
# ---------------------------------------------------------------------------------------------------


@dataclass
class _Models:
    gpt: Any
    sovits: Any
    encoders: Any  # encoders.EncoderBackends: HuBERT and BERT on CoreML or MLX


@dataclass
class _Reference:
    """The reference side of a voice (gpt-sovits-v2.md §4.1, §6.2, §2.3), computed once."""

    key: tuple
    prompt_semantic: np.ndarray | None  # (Ty,) int32; None in reference-free mode
    prompt_phones: np.ndarray | None  # (n,) int32
    prompt_bert: np.ndarray | None  # (1024, n) float32
    prompt_norm_text: str
    ge: mx.array  # (1, gin, 1)
    seconds: float


@dataclass
class _TextChunk:
    phones: np.ndarray  # (n,) int32 target phones
    bert: np.ndarray  # (1024, n) float32
    norm_text: str


@dataclass
class _Timer:
    timings: dict[str, float] = field(default_factory=dict)

    def add(self, stage: str, seconds: float) -> None:
        self.timings[stage] = self.timings.get(stage, 0.0) + seconds


class _NoiseBank:
    """Standard-normal SoVITS prior noise, (channels, frame) indexed by absolute 50 Hz output frame.

    Drawn in fixed blocks from one seeded generator, so a frame's noise does not depend on how the
    frames were requested (whole sentence or streamed windows)."""

    def __init__(self, seed: tuple[int, ...], channels: int):
        self._rng = np.random.default_rng(list(seed))
        self._channels = channels
        self._frames = np.zeros((channels, 0), dtype=np.float32)

    def take(self, start: int, n: int) -> np.ndarray:
        start = max(0, start)
        while self._frames.shape[1] < start + n:
            block = self._rng.standard_normal((NOISE_BLOCK_FRAMES, self._channels), dtype=np.float32).T
            self._frames = np.concatenate([self._frames, block], axis=1)
        return self._frames[:, start : start + n][None]


def _fade(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Raised-cosine crossfade weights (fade-out, fade-in) that sum to 1 (the two signals are
    near-identical decodes of the same tokens, so an amplitude-preserving fade is right)."""
    t = (np.arange(n, dtype=np.float32) + 0.5) / max(n, 1)
    fade_in = np.sin(0.5 * np.pi * t) ** 2
    return (1.0 - fade_in).astype(np.float32), fade_in.astype(np.float32)


class _Stitcher:
    """Joins the overlapping SoVITS window decodes of one streamed sentence into seamless pieces.

    Output frames (50 Hz / speed) lie on one grid for the whole sentence: frame ``i`` interpolates
    the 50 Hz features at source position ``(i + 0.5) * speed - 0.5`` (torch's align_corners=False
    rule with the nominal ratio), so every window places the same sound at the same sample."""

    def __init__(self, hop: int, speed: float, crossfade: int):
        self.hop = hop
        self.speed = speed
        self.crossfade = crossfade
        self.done_tokens = 0  # audio up to this token boundary was emitted (minus `pending`)
        self.pending = np.zeros(0, dtype=np.float32)  # held-back tail of the previous piece

    def frame(self, token: int) -> int:
        """Output frame where token boundary ``token`` falls."""
        return 2 * token if self.speed == 1 else round(2 * token / self.speed)

    def end_frame(self, n_tokens: int) -> int:
        """Output frames of a whole sentence of ``n_tokens`` (upstream: ``int(2T/speed)+1`` if speed != 1)."""
        return 2 * n_tokens if self.speed == 1 else int(2 * n_tokens / self.speed) + 1

    def piece(self, audio: np.ndarray, start: int, stop: int, final: bool) -> np.ndarray:
        """New audio from a window decode that begins at token ``start``'s frame: everything after
        ``done_tokens`` up to ``stop`` (to the end when ``final``), crossfaded with the held tail;
        the last ``crossfade`` samples are held back for the next piece unless ``final``."""
        a = (self.frame(self.done_tokens) - self.frame(start)) * self.hop
        b = len(audio) if final else (self.frame(stop) - self.frame(start)) * self.hop
        xf = min(len(self.pending), a)
        out = audio[a:b]
        if xf:
            fade_out, fade_in = _fade(xf)
            mixed = self.pending[len(self.pending) - xf :] * fade_out + audio[a - xf : a] * fade_in
            out = np.concatenate([self.pending[: len(self.pending) - xf], mixed, out])
        elif len(self.pending):
            out = np.concatenate([self.pending, out])
        if final:
            self.pending = np.zeros(0, dtype=np.float32)
        else:
            keep = min(self.crossfade, len(out))
            self.pending = out[len(out) - keep :].copy()
            out = out[: len(out) - keep]
        self.done_tokens = stop
        return out.astype(np.float32, copy=False)


# ---------------------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------------------


class GPTSoVITSEngine:
    """GPT-SoVITS v2 text-to-speech on MLX. Thread-safe: one lock serialises all model use."""

    def __init__(
        self,
        model_dir: str | Path | None = None,
        device: str = "auto",
        encoders: str = "auto",
        config: SynthesisConfig | None = None,
        progress: Callable[[str], None] | None = None,
    ):
        self.model_dir = Path(model_dir).expanduser() if model_dir else default_model_dir()
        self.device = self._pick_device(device)
        if encoders not in ENCODER_MODES:
            raise ConfigError(f"encoders={encoders!r} is invalid: use one of {', '.join(ENCODER_MODES)}")
        self.encoders = encoders  # CoreML on macOS ("auto"/"coreml"), MLX otherwise; see encoders.py
        self.config = config if config is not None else SynthesisConfig()
        if not isinstance(self.config, SynthesisConfig):
            raise ConfigError(f"config must be a SynthesisConfig, not {type(self.config).__name__}")
        self.progress = progress
        self.voice: VoiceSpec | None = None
        self._lock = threading.RLock()
        self._model_cache: dict[tuple, Any] = {}
        self._ref_cache: dict[tuple, _Reference] = {}
        self._encoder_cache: dict[tuple, Any] = {}
        self._stats = {
            "requests": 0,
            "streams": 0,
            "failures": 0,
            "skipped": 0,
            "cancelled": 0,
            "chunks": 0,
            "tokens": 0,
            "audio_seconds": 0.0,
            "reference_computations": 0,
            "timings": {},
        }

    # ---- setup -----------------------------------------------------------------------------------
    @staticmethod
    def _pick_device(device: str) -> mx.Device | None:
        if device == "auto":
            return None
        if device == "cpu":
            return mx.Device(mx.cpu)
        if device in ("gpu", "metal", "cuda"):
            if not mx.is_available(mx.gpu):
                raise ConfigError(f"device={device!r} was requested but this MLX build has no GPU backend")
            return mx.Device(mx.gpu)
        raise ConfigError(f"device={device!r} is invalid: use 'auto', 'cpu' or 'gpu'")

    def _on_device(self):
        return mx.stream(self.device) if self.device is not None else contextlib.nullcontext()

    def _say(self, message: str) -> None:
        if self.progress is not None:
            self.progress(message)

    def _cached_model(self, kind: str, path: Path, loader: Callable[[Path], Any]) -> Any:
        path = Path(path)
        try:
            stamp = path.stat().st_mtime_ns
        except OSError:
            stamp = None
        key = (kind, str(path.resolve()), stamp)
        if key not in self._model_cache:
            self._say(f"loading {kind} model {path}")
            with _stage("load", None, "load"):
                self._model_cache[key] = loader(path)
        return self._model_cache[key]

    def _models(self, spec: VoiceSpec) -> _Models:
        from .convert import load  # the lead's loader: original files or converted MLX files

        root = self.model_dir
        return _Models(
            gpt=self._cached_model("gpt", spec.gpt, lambda p: load.load_gpt(p, root=root)),
            sovits=self._cached_model("sovits", spec.sovits, lambda p: _load_sovits(p, root)),  # issue 15
            encoders=self._encoders(spec),
        )

    def _encoders(self, spec: VoiceSpec):
        """The voice's HuBERT/BERT behind one interface (CoreML with MLX fallback); the MLX models come
        from this engine's model cache, BERT only when Chinese text needs it."""
        from .convert import load
        from .encoders import EncoderBackends

        key = (str(spec.hubert), str(spec.bert))
        if key not in self._encoder_cache:
            root = self.model_dir
            self._encoder_cache[key] = EncoderBackends(
                spec.hubert,
                spec.bert,
                mode=self.encoders,
                root=root,
                mlx_hubert=lambda: self._cached_model("hubert", spec.hubert, lambda p: load.load_hubert(p, root=root)),
                mlx_bert=lambda: self._bert(spec.bert),
            )
        return self._encoder_cache[key]

    def _bert(self, spec_bert: Path):
        from .convert import load

        return self._cached_model("bert", spec_bert, lambda p: load.load_bert(p, root=self.model_dir))

    def _resolve(self, voice: str | VoiceSpec | None) -> VoiceSpec:
        if voice is None:
            if self.voice is None:
                raise ConfigError("no voice loaded: call load_voice(name) or pass voice=...")
            return self.voice
        if isinstance(voice, VoiceSpec):
            voices_mod.ensure_installed(voice, self.model_dir)  # missing files: VoiceNotInstalledError
            return voice
        if isinstance(voice, str):
            return voices_mod.resolve_voice(voice, self.model_dir)
        raise ConfigError(f"voice must be a name or a VoiceSpec, not {type(voice).__name__}")

    def load_voice(self, name_or_spec: str | VoiceSpec) -> VoiceSpec:
        """Make ``name_or_spec`` the current voice: load its models and compute its reference side."""
        spec = self._resolve(name_or_spec)
        with self._lock, self._on_device():
            if self.voice is not None and self.voice != spec:
                self._drop_models_except(spec)
            models = self._models(spec)
            self._reference(spec, models, self.config.prompt_lang or spec.prompt_lang, _Timer())
            self.voice = spec
        return spec

    def _drop_models_except(self, spec: VoiceSpec) -> None:
        """Free the previous voice's GPT/SoVITS when switching voices (the encoders are shared)."""
        keep = _voice_files(spec)
        for key in [k for k in self._model_cache if k[0] in ("gpt", "sovits") and k[1] not in keep]:
            del self._model_cache[key]

    # ---- reference side --------------------------------------------------------------------------
    def _reference(self, spec: VoiceSpec, models: _Models, prompt_lang: str, timer: _Timer) -> _Reference:
        files = (spec.reference, spec.gpt, spec.sovits, spec.hubert)  # + the BERT folder, by name
        stamps = tuple(_mtime(p) for p in files)
        key = (spec.name, *map(str, files), stamps, str(spec.bert), spec.prompt_text, prompt_lang)
        ref = self._ref_cache.get(key)
        if ref is not None:
            return ref
        self._say(f"computing the reference features of voice {spec.name!r}")
        with _stage("reference", timer, "reference"):
            wav32k, wav16k = self._load_reference(spec.reference, models.sovits)
            seconds = len(wav16k) / HUBERT_SR
            if not REF_MIN_SECONDS <= seconds <= REF_MAX_SECONDS:
                raise ConfigError(
                    f"reference audio {spec.reference} is {seconds:.2f} s long; GPT-SoVITS needs a "
                    f"{REF_MIN_SECONDS:g}-{REF_MAX_SECONDS:g} s clip (cut or replace it)"
                )
            ge = self._ref_embedding(models.sovits, wav32k)
        # an empty prompt text means reference-free mode (gpt-sovits-v2.md §8.3): no prompt at all
        prompt_phones, prompt_bert, norm_text = self._prompt_text_features(
            spec.prompt_text or "", prompt_lang, spec, _symbol_version(models), timer
        )
        prompt_semantic = None
        if prompt_phones is not None:
            with _stage("reference", timer, "reference"):
                prompt_semantic = self._prompt_semantic(models, wav16k)
        ref = _Reference(key, prompt_semantic, prompt_phones, prompt_bert, norm_text, ge, seconds)
        # drop stale entries of the same voice (changed files or prompt)
        for old in [k for k in self._ref_cache if k[0] == spec.name]:
            del self._ref_cache[old]
        self._ref_cache[key] = ref
        self._stats["reference_computations"] += 1
        return ref

    def _load_reference(self, path: Path, sovits) -> tuple[np.ndarray, np.ndarray]:
        """(wav at the SoVITS rate for the spectrogram, wav at 16 kHz for HuBERT), both mono float32."""
        from .models import audio

        wav, sr = audio.load_wav(path)
        wav = np.asarray(wav, dtype=np.float32)
        target = _sovits_rate(sovits)
        wav32k = wav if sr == target else audio.resample(wav, sr, target)
        peak = float(np.abs(wav32k).max()) if len(wav32k) else 0.0
        if peak > 1:  # upstream _get_ref_spec: divide by min(2, max)
            wav32k = wav32k / min(2.0, peak)
        wav16k = self._load_reference_16k(path, wav, sr)
        return np.asarray(wav32k, dtype=np.float32), np.asarray(wav16k, dtype=np.float32)

    def _load_reference_16k(self, path: Path, wav: np.ndarray, sr: int) -> np.ndarray:
        """The HuBERT input before the 0.6 s tail (librosa.load(sr=16000) upstream: soxr HQ).
        A separate method so tests can inject the golden's own resampled array."""
        from .models import audio

        return wav if sr == HUBERT_SR else audio.resample(wav, sr, HUBERT_SR)

    @staticmethod
    def _ref_embedding(sovits, wav32k: np.ndarray) -> mx.array:
        from .models import audio

        a = sovits.args
        spec = audio.spectrogram(wav32k, a.filter_length, a.hop_length, a.win_length)
        ge = sovits.ref_embedding(mx.array(spec))
        mx.eval(ge)
        return ge

    @staticmethod
    def _prompt_semantic(models: _Models, wav16k: np.ndarray) -> np.ndarray:
        ssl = models.encoders.hubert_features(wav16k)  # appends the 0.6 s zero tail; (1, 768, T)
        codes = models.sovits.extract_latent(mx.array(ssl))
        return np.array(codes[0, 0]).astype(np.int32)

    def _prompt_text_features(self, prompt_text: str, lang: str, spec: VoiceSpec, version: str, timer: _Timer):
        """Prompt phones (upstream: strip, end mark, no cut) and their BERT features."""
        from . import text as text_mod

        with _stage("text", timer, "text"):
            result = text_mod.prompt_phones(prompt_text, lang, version)
        if result is None:
            return None, None, ""
        with _stage("bert", timer, "bert"):
            bert = self._bert_for([result], spec, self._encoders(spec))[0]
        return np.asarray(result.phone_ids, dtype=np.int32), bert, result.norm_text

    # ---- text side -------------------------------------------------------------------------------
    def _text_chunks(
        self, text: str, lang: str, method: str, spec: VoiceSpec, version: str, timer: _Timer
    ) -> list[_TextChunk]:
        from . import text as text_mod
        from .text.langsplit import check_option

        if not isinstance(text, str):
            raise ConfigError(f"text must be a string, not {type(text).__name__}")
        check_option(lang)  # a bad language is reported even for empty text
        if not _WORD_RE.search(text):
            raise NothingToSpeakError(f"nothing to speak in {text[:80]!r} (no letters or digits)")
        with _stage("text", timer, "text"):
            chunks = text_mod.preprocess(text, lang, method, version)
        if not chunks:
            raise NothingToSpeakError(f"nothing to speak in {text[:80]!r}")
        with _stage("bert", timer, "bert"):
            berts = self._bert_for(chunks, spec, self._encoders(spec))
        return [
            _TextChunk(np.asarray(c.phone_ids, dtype=np.int32), b, c.norm_text) for c, b in zip(chunks, berts)
        ]

    @staticmethod
    def _bert_for(results: list, spec: VoiceSpec, encoders) -> list[np.ndarray]:
        """(1024, n_phones) features per phone result (gpt-sovits-v2.md §3): the BERT for Chinese
        segments, zeros for the others; all Chinese segments of all results run in one batch."""
        wanted = [
            (i, j, seg) for i, r in enumerate(results) for j, seg in enumerate(r.segments) if seg.lang == "zh"
        ]
        feats: dict[tuple[int, int], np.ndarray] = {}
        if wanted:
            width = encoders.bert_hidden_size
            if width != BERT_DIM:
                raise SynthesisError(
                    f"the BERT at {spec.bert} is {width} wide but the GPT needs {BERT_DIM}-wide features "
                    "(chinese-roberta-wwm-ext-large); Chinese text cannot be spoken with this BERT",
                    stage="bert",
                )
            out = encoders.bert_features_batch([(seg.norm_text, seg.word2ph) for _, _, seg in wanted])
            feats = {(i, j): f for (i, j, _), f in zip(wanted, out)}
        berts = []
        for i, r in enumerate(results):
            parts = [
                feats.get((i, j), np.zeros((BERT_DIM, len(seg.phone_ids)), dtype=np.float32))
                for j, seg in enumerate(r.segments)
            ]
            bert = np.concatenate(parts, axis=1) if parts else np.zeros((BERT_DIM, 0), np.float32)
            if bert.shape[1] != len(r.phone_ids):
                raise SynthesisError(
                    f"BERT features cover {bert.shape[1]} phones but the text has {len(r.phone_ids)} "
                    f"({r.norm_text!r})",
                    stage="bert",
                )
            berts.append(bert.astype(np.float32, copy=False))
        return berts

    # ---- GPT and SoVITS --------------------------------------------------------------------------
    def _token_stream(self, models: _Models, ref: _Reference, chunk: _TextChunk, cfg: SynthesisConfig, seed: int):
        from .models.t2s_generate import SamplingParams, generate

        if ref.prompt_phones is not None:
            phones = np.concatenate([ref.prompt_phones, chunk.phones])
            bert = np.concatenate([ref.prompt_bert, chunk.bert], axis=1)
            prompt = ref.prompt_semantic
        else:
            phones, bert, prompt = chunk.phones, chunk.bert, None
        params = SamplingParams(
            top_k=cfg.top_k, top_p=cfg.top_p, temperature=cfg.temperature, repetition_penalty=cfg.repetition_penalty
        )
        return generate(
            models.gpt,
            phones[None].astype(np.int32),
            bert[None],
            None if prompt is None else np.asarray(prompt, dtype=np.int32)[None],
            params,
            early_stop_num=models.gpt.args.early_stop_num,
            seed=seed,
        )

    def _decode(
        self,
        models: _Models,
        ref: _Reference,
        tokens: np.ndarray,
        phones: np.ndarray,
        speed: float,
        noise_scale: float,
        bank: _NoiseBank,
        first_frame: int,
    ) -> np.ndarray:
        frames = 2 * len(tokens) if speed == 1 else int(2 * len(tokens) / speed) + 1
        noise = bank.take(first_frame, frames) if noise_scale > 0 else None
        audio = models.sovits.decode(
            mx.array(np.asarray(tokens, dtype=np.int32)[None, None]),
            mx.array(phones[None].astype(np.int32)),
            noise_scale=noise_scale,
            speed=speed,
            noise=None if noise is None else mx.array(noise),
            ge=ref.ge,
        )
        return np.array(audio).reshape(-1).astype(np.float32)

    def _new_noise_bank(self, seed: int, sentence: int, channels: int) -> _NoiseBank:
        """The SoVITS prior noise of text chunk ``sentence`` (a separate method: tests inject noise)."""
        return _NoiseBank((seed, sentence), channels)

    # ---- requests --------------------------------------------------------------------------------
    def _prepare(self, text, voice, config, overrides, timer: _Timer):
        cfg = (config if config is not None else self.config).replace(**overrides)
        spec = self._resolve(voice)
        models = self._models(spec)
        prompt_lang = cfg.prompt_lang or spec.prompt_lang or spec.language
        ref = self._reference(spec, models, prompt_lang, timer)
        lang = cfg.text_lang or spec.language
        chunks = self._text_chunks(text, lang, cfg.text_split_method, spec, _symbol_version(models), timer)
        speed = float(cfg.speed_factor if cfg.speed_factor is not None else spec.speed_factor)
        seed = cfg.seed if cfg.seed != -1 else secrets.randbelow(2**31)
        return cfg, spec, models, ref, chunks, speed, seed

    def synthesize(
        self,
        text: str,
        voice: str | VoiceSpec | None = None,
        config: SynthesisConfig | None = None,
        cancel: threading.Event | None = None,
        **overrides,
    ) -> SynthesisResult:
        """Speak ``text`` in one piece: float32 audio of all chunks, each followed by
        ``fragment_interval`` seconds of silence (upstream ``audio_postprocess``).

        Setting ``cancel`` stops the work between two GPT tokens and raises :class:`SynthesisCancelled`."""
        t_start = time.perf_counter()
        timer = _Timer()
        with self._lock, self._on_device():
            try:
                cfg, spec, models, ref, chunks, speed, seed = self._prepare(text, voice, config, overrides, timer)
                sr = _sovits_rate(models.sovits)
                pieces, all_tokens = [], []
                for i, chunk in enumerate(chunks):
                    tokens = self._generate_all(models, ref, chunk, cfg, seed + i, timer, cancel)
                    with _stage("sovits", timer, "sovits"):
                        bank = self._new_noise_bank(seed, i, _prior_channels(models.sovits))
                        audio = self._decode(models, ref, tokens, chunk.phones, speed, cfg.noise_scale, bank, 0)
                    pieces.append(_postprocess(audio, sr, cfg.fragment_interval))
                    all_tokens.append(tokens)
            except BaseException as exc:
                self._count_failure(exc)
                raise
            audio = np.concatenate(pieces).astype(np.float32)
            tokens = np.concatenate(all_tokens).astype(np.int32)
            timer.add("total", time.perf_counter() - t_start)
            self._record(timer, len(audio) / sr, len(tokens), len(chunks), streams=0)
        return SynthesisResult(audio, sr, len(audio) / sr, tokens, timer.timings, spec.name)

    def _generate_all(self, models, ref, chunk, cfg, seed, timer: _Timer, cancel=None) -> np.ndarray:
        tokens: list[int] = []
        with _stage("gpt", None, "gpt"):
            gen = self._token_stream(models, ref, chunk, cfg, seed)
        while True:
            if cancel is not None and cancel.is_set():
                self._stats["cancelled"] += 1
                raise SynthesisCancelled("synthesis cancelled")
            t0 = time.perf_counter()
            with _stage("gpt", None, "gpt"):
                tok = next(gen, None)
            timer.add("gpt_decode" if tokens else "gpt_prefill", time.perf_counter() - t0)
            if tok is None:
                return np.asarray(tokens, dtype=np.int32)
            tokens.append(int(tok))

    def synthesize_stream(
        self,
        text: str,
        voice: str | VoiceSpec | None = None,
        config: SynthesisConfig | None = None,
        cancel: threading.Event | None = None,
        **overrides,
    ) -> Iterator[AudioChunk]:
        """Speak ``text`` as a stream of :class:`AudioChunk` produced while the GPT is still generating.

        Settings, voice and text are checked before this returns (errors raise here, not on the
        first ``next``). Setting ``cancel`` stops generation between two tokens; no further chunk is
        yielded. Each sentence's last chunk carries the ``fragment_interval`` silence."""
        t_start = time.perf_counter()
        timer = _Timer()
        with self._lock, self._on_device():
            try:
                prepared = self._prepare(text, voice, config, overrides, timer)
            except BaseException as exc:
                self._count_failure(exc)
                raise
        return self._stream(prepared, timer, t_start, cancel)

    def _stream(self, prepared, timer: _Timer, t_start: float, cancel: threading.Event | None) -> Iterator[AudioChunk]:
        cfg, spec, models, ref, chunks, speed, seed = prepared
        sr = _sovits_rate(models.sovits)
        index = n_audio = n_tokens = n_chunks = 0
        first_audio = None
        cancelled = False
        try:
            for s, chunk in enumerate(chunks):
                stitcher = _Stitcher(_sovits_hop(models.sovits), speed, round(cfg.stream_crossfade_ms * sr / 1000))
                bank = self._new_noise_bank(seed, s, _prior_channels(models.sovits))
                with self._lock, self._on_device(), _stage("gpt", None, "gpt"):
                    gen = self._token_stream(models, ref, chunk, cfg, seed + s)
                tokens: list[int] = []
                next_at = cfg.stream_first_tokens
                while True:
                    if cancel is not None and cancel.is_set():
                        cancelled = True
                        gen.close()
                        return
                    t0 = time.perf_counter()
                    with self._lock, self._on_device(), _stage("gpt", None, "gpt"):
                        tok = next(gen, None)
                    timer.add("gpt_decode" if tokens else "gpt_prefill", time.perf_counter() - t0)
                    done = tok is None
                    if not done:
                        tokens.append(int(tok))
                        n_tokens += 1
                        if len(tokens) < next_at:
                            continue
                        next_at = len(tokens) + cfg.stream_chunk_tokens
                    with self._lock, self._on_device(), _stage("sovits", timer, "sovits"):
                        piece = self._stream_piece(models, ref, chunk, cfg, speed, stitcher, bank, tokens, done)
                    if piece is not None:
                        if done:
                            piece = _postprocess(piece, sr, cfg.fragment_interval, normalise=False)
                        if first_audio is None:
                            first_audio = time.perf_counter() - t_start
                        final = done and s == len(chunks) - 1
                        yield AudioChunk(piece, sr, index, final, s, len(piece) / sr)
                        index += 1
                        n_audio += len(piece)
                    if done:
                        break
                n_chunks += 1
        except GeneratorExit:
            cancelled = True
            raise
        except BaseException as exc:
            self._count_failure(exc)
            raise
        finally:
            if first_audio is not None:
                timer.add("time_to_first_audio", first_audio)
            timer.add("total", time.perf_counter() - t_start)
            with self._lock:
                self._record(timer, n_audio / sr, n_tokens, n_chunks, streams=1)
                if cancelled:
                    self._stats["cancelled"] += 1

    def _stream_piece(
        self, models, ref, chunk, cfg, speed, stitcher: _Stitcher, bank, tokens: list[int], done: bool
    ) -> np.ndarray | None:
        """The next piece of a streamed sentence, or None when there is nothing new to emit yet.

        Decodes tokens[start:] where ``start`` lies ``stream_context_tokens`` before the emitted
        boundary; emits up to ``stream_lookahead_tokens`` before the newest token (all of it when
        ``done``), since the last tokens' audio changes once their right context exists."""
        stop = len(tokens) if done else len(tokens) - cfg.stream_lookahead_tokens
        if not done and stop <= stitcher.done_tokens:
            return None
        if not tokens:
            return np.zeros(0, dtype=np.float32)
        start = max(0, stitcher.done_tokens - cfg.stream_context_tokens)
        window = np.asarray(tokens[start:], dtype=np.int32)
        audio = self._decode_window(models, ref, window, chunk.phones, cfg.noise_scale, bank, stitcher, start, done)
        return stitcher.piece(audio, start, stop, done)

    @staticmethod
    def _decode_window(
        models, ref, window: np.ndarray, phones: np.ndarray, noise_scale: float, bank, stitcher: _Stitcher,
        start: int, final: bool,
    ) -> np.ndarray:
        """SoVITS decode of the tokens ``window`` (which begin at token ``start``) onto the sentence's
        output-frame grid: frames [frame(start), frame(end)) (to the sentence's end frame when final).
        Same stages as ``decode``; only the speed interpolation uses the fixed grid."""
        sovits = models.sovits
        feats = sovits.encode_features(mx.array(window[None, None]), mx.array(phones[None]), ref.ge)
        n = start + len(window)
        f0 = stitcher.frame(start)
        f1 = stitcher.end_frame(n) if final else stitcher.frame(n)
        if stitcher.speed != 1:
            length = feats.shape[2]
            src = (np.arange(f0, f1) + 0.5) * stitcher.speed - 0.5 - 2 * start
            src = np.clip(src, 0, length - 1)
            lo = np.floor(src).astype(np.int32)
            hi = np.minimum(lo + 1, length - 1)
            w = mx.array((src - lo).astype(np.float32))
            feats = feats[:, :, mx.array(lo)] * (1 - w) + feats[:, :, mx.array(hi)] * w
        _, m_p, logs_p, y_mask = sovits.project(feats, 1.0)
        noise = mx.array(bank.take(f0, m_p.shape[2])) if noise_scale > 0 else None
        z_p = sovits.sample_prior(m_p, logs_p, noise_scale, noise=noise)
        audio = sovits.vocode(sovits.flow_reverse(z_p, y_mask, ref.ge), ref.ge, y_mask)
        return np.array(audio).reshape(-1).astype(np.float32)

    # ---- bookkeeping -----------------------------------------------------------------------------
    def _count_failure(self, exc: BaseException) -> None:
        if isinstance(exc, SynthesisCancelled):
            return  # counted as "cancelled" where it was raised
        with self._lock:
            self._stats["skipped" if isinstance(exc, NothingToSpeakError) else "failures"] += 1

    def _record(self, timer: _Timer, audio_seconds: float, tokens: int, chunks: int, streams: int) -> None:
        st = self._stats
        st["requests"] += 1
        st["streams"] += streams
        st["chunks"] += chunks
        st["tokens"] += tokens
        st["audio_seconds"] += audio_seconds
        for stage, seconds in timer.timings.items():
            total, count = st["timings"].get(stage, (0.0, 0))
            st["timings"][stage] = (total + seconds, count + 1)

    def stats(self) -> dict:
        """Counts, audio and compute seconds, mean stage timings (seconds per request that had the
        stage), the current voice and the backends."""
        with self._lock:
            st = self._stats
            means = {k: total / count for k, (total, count) in st["timings"].items() if count}
            compute = st["timings"].get("total", (0.0, 0))[0]
            return {
                **{k: st[k] for k in ("requests", "streams", "failures", "skipped", "cancelled", "chunks", "tokens")},
                "audio_seconds": st["audio_seconds"],
                "compute_seconds": compute,
                "rtf": compute / st["audio_seconds"] if st["audio_seconds"] else None,
                "mean_timings": means,
                "reference_computations": st["reference_computations"],
                "cached_references": len(self._ref_cache),
                "loaded_models": sorted(f"{k[0]}:{Path(k[1]).name}" for k in self._model_cache),
                "voice": self.voice.name if self.voice else None,
                "backends": {
                    "device": str(self.device if self.device is not None else mx.default_device()),
                    "encoders": self._encoders(self.voice).status() if self.voice else {"mode": self.encoders},
                    "gpt": _gpt_backend(),
                    "sovits": _vocoder_status(self._model_cache, self.voice),  # issue 15 hook
                    "blas": _blas_status(),
                },
            }

    def warmup(self) -> None:
        """Warm the GPT decode path, then one short synthesis with the current voice (loads and caches
        everything, compiles)."""
        from .models import t2s_generate

        spec = self._resolve(None)
        text = "你好。" if spec.language in ("zh", "all_zh") else "Hello."
        with self._lock, self._on_device():
            t2s_generate.warmup(self._models(spec).gpt)  # numpy views (CPU) / compiled decode buckets (GPU)
        with self._lock:
            saved = {k: (dict(v) if isinstance(v, dict) else v) for k, v in self._stats.items()}
            try:
                self.synthesize(text, fragment_interval=0.0)
            finally:
                saved["reference_computations"] = self._stats["reference_computations"]
                self._stats = saved

    def cleanup(self) -> dict:
        """Free what the current voice does not use: other voices' models, reference features and
        encoders. Returns what was dropped (the node's ``cleanup`` control command)."""
        with self._lock:
            keep = self.voice
            models = [k for k in self._model_cache if keep is None or k[1] not in _voice_files(keep)]
            refs = [k for k in self._ref_cache if keep is None or k[0] != keep.name]
            encs = [k for k in self._encoder_cache if keep is None or k != (str(keep.hubert), str(keep.bert))]
            for k in models:
                del self._model_cache[k]
            for k in refs:
                del self._ref_cache[k]
            for k in encs:
                del self._encoder_cache[k]
        return {"models": len(models), "references": len(refs), "encoders": len(encs)}

    def list_voices(self) -> list[dict]:
        return [dataclasses.asdict(v) for v in voices_mod.list_voices(self.model_dir)]


# ---------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _stage(stage: str, timer: _Timer | None, name: str):
    """Time a stage into ``timer`` and turn unexpected failures into :class:`SynthesisError`."""
    t0 = time.perf_counter()
    try:
        yield
    except (PrimeSpeechError, TextFrontendError, GeneratorExit, KeyboardInterrupt):
        raise
    except Exception as exc:
        raise SynthesisError(f"{stage} stage failed: {type(exc).__name__}: {exc}", stage=stage) from exc
    finally:
        if timer is not None:
            timer.add(name, time.perf_counter() - t0)


def _postprocess(audio: np.ndarray, sr: int, fragment_interval: float, normalise: bool = True) -> np.ndarray:
    """Upstream ``audio_postprocess`` for one fragment: /max if max > 1, then the silence."""
    audio = np.asarray(audio, dtype=np.float32)
    if normalise and len(audio):
        peak = float(np.abs(audio).max())
        if peak > 1:
            audio = audio / peak
    return np.concatenate([audio, np.zeros(int(sr * fragment_interval), dtype=np.float32)])


def _voice_files(spec: VoiceSpec) -> set[str]:
    """Resolved model paths of a voice, as the model cache keys them."""
    return {str(Path(p).resolve()) for p in (spec.gpt, spec.sovits, spec.hubert, spec.bert)}


def _mtime(path: Path) -> int | None:
    try:
        return Path(path).stat().st_mtime_ns
    except OSError:
        return None


def _sovits_rate(sovits) -> int:
    return int(sovits.sampling_rate)


def _sovits_hop(sovits) -> int:
    """Output samples per 50 Hz latent frame (640)."""
    return int(sovits.samples_per_frame)


def _gpt_backend() -> str:
    """The GPT decode-step implementation in use (t2s_generate picks numpy or MLX when it offers both)."""
    from .models import t2s_generate

    pick = getattr(t2s_generate, "decode_backend", None)
    try:
        return str(pick()) if pick is not None else "mlx"
    except Exception:  # a bad override is reported by the GPT stage itself
        return "unknown"


def _blas_status() -> dict:
    """The CPU BLAS MLX links (name, path, why not a fast one) and the thread settings in force."""
    from . import _blas

    return {**_blas.info(), "threads": _blas.thread_settings()}


def _symbol_version(models: _Models) -> str:
    """Phone table of the voice ("v1" 322 symbols, "v2" 732), from the SoVITS text embedding."""
    return str(models.sovits.args.version)


def _prior_channels(sovits) -> int:
    return int(sovits.args.inter_channels)


# ---- issue 15 hook: the SoVITS generator on ONNX Runtime where MLX runs on the CPU (models/vocoder.py) ----
def _load_sovits(path, root):
    from .convert import load
    from .models import vocoder

    return vocoder.attach(load.load_sovits(path, root=root), cache_dir=vocoder.default_cache_dir(path, root))


def _vocoder_status(model_cache: dict, voice) -> dict:
    from .models import vocoder

    wanted = None if voice is None else str(Path(voice.sovits).resolve())
    models = [m for k, m in model_cache.items() if k[0] == "sovits" and wanted in (None, k[1])]
    return vocoder.status(models[0]) if models else {"backend": "not loaded", "mode": vocoder.vocoder_mode()}
