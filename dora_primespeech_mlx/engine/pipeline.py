"""One request's way through the models: text -> chunks (phones + BERT) -> GPT tokens -> SoVITS audio.

Functions over a loaded :class:`Models` bundle, no caching and no locking (the engine does both):
:func:`text_chunks` (front end + batched BERT), :func:`token_stream` / :func:`generate_tokens` (the GPT, one
sentence), :func:`sentence_latent` + :func:`vocode` (SoVITS, one sentence), :class:`NoiseBank` (the prior noise
indexed by output frame, so a streamed and a whole decode draw the same noise) and :func:`postprocess`
(upstream's per-fragment normalisation and the inter-sentence silence). Cancellation is checked between tokens
and between stages."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from .. import text as text_mod
from ..assets.catalog import VoiceSpec
from ..errors import ConfigError, NothingToSpeakError, SynthesisCancelled, SynthesisError
from ..models.gpt.generate import SamplingParams, generate, start
from ..models.gpt.numpy_decoder import NumpyDecoder, _kernels
from ..models.sovits.model import output_frames
from ..text.budget import Limits, checks
from ..text.options import TextData
from .config import SynthesisConfig
from .stats import Timer, stage

#: Phones that are no speech: punctuation, pauses and the unknown-symbol marker. A text of only these is
#: not spoken (the models would babble ~2 s of sound unrelated to it).
UNSPOKEN = frozenset(["!", "?", "…", ",", ".", "-", "SP", "SP2", "SP3", "UNK", "_"])
BERT_DIM = 1024  # the GPT's bert_proj input width (chinese-roberta-wwm-ext-large)
NOISE_BLOCK_FRAMES = 256


@dataclass
class Models:
    gpt: Any
    sovits: Any
    encoders: Any  # encoders.EncoderBackends: HuBERT and BERT on CoreML or MLX
    sv: Any = None  # the speaker-verification model (ERes2NetV2) of a v2Pro / v2ProPlus voice

    @property
    def symbol_version(self) -> str:
        """Phone table of the voice ("v1" 322 symbols, "v2" 732), from the SoVITS text embedding."""
        return str(self.sovits.args.version)

    @property
    def sample_rate(self) -> int:
        return int(self.sovits.sampling_rate)

    @property
    def hop(self) -> int:
        """Output samples per 50 Hz latent frame (640)."""
        return int(self.sovits.samples_per_frame)

    @property
    def prior_channels(self) -> int:
        return int(self.sovits.args.inter_channels)


@dataclass
class TextChunk:
    phones: np.ndarray  # (n,) int32 target phones
    bert: np.ndarray | None  # (1024, n) float32; None until :func:`fill_bert` (streams compute it sentence-wise)
    norm_text: str
    result: Any = None  # the front end's result (what the BERT features are computed from)
    source: str = ""  # the piece of the text it was read from (text.segmentation.split_text)


def check_cancel(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise SynthesisCancelled("synthesis cancelled")


def text_chunks(text: str, lang: str, method: str, spec: VoiceSpec, models: Models, timer: Timer,
                bert_upto: int | None = None, cancel: threading.Event | None = None,
                budget_s: float | None = None, *, data: TextData) -> list[TextChunk]:
    """The text's sentences as phone ids and BERT features (NothingToSpeakError when there are none, or when
    their phones are only punctuation: text the language cannot read, e.g. Chinese as ``en``). With
    ``bert_upto`` only the first ``bert_upto`` sentences get their BERT features now (:func:`fill_bert` adds
    the others): a stream's first audio then waits for one sentence's BERT, not the whole text's. The front
    end stops at its next checkpoint once ``cancel`` is set or after ``budget_s`` seconds
    (:class:`~..text.errors.TextFrontendError` naming MAX_TEXT_SECONDS). ``data``: the front end's folders and
    g2pW choice (the engine's :class:`~..text.options.TextData`)."""
    if not isinstance(text, str):
        raise ConfigError(f"text must be a string, not {type(text).__name__}")
    text_mod.check_option(lang)  # a bad language is reported even for empty text
    if not text_mod.has_speakable(text):
        raise NothingToSpeakError(f"nothing to speak in {text[:80]!r} (no letters or digits)")
    limits = Limits(cancel, SynthesisCancelled("synthesis cancelled"),
                    None if budget_s is None else time.monotonic() + budget_s,
                    None if budget_s is None else text_mod.TextFrontendError(
                        f"the text front end needs more than {budget_s:g} s for this text ({len(text)} characters; "
                        f"MAX_TEXT_SECONDS={budget_s:g}): shorten it or raise MAX_TEXT_SECONDS"))
    with stage("text", timer), checks(limits):  # (data the front end reads: it calls nothing of the engine's)
        results = text_mod.preprocess(text, lang, method, models.symbol_version, data=data)
    if not results:
        raise NothingToSpeakError(f"nothing to speak in {text[:80]!r}")
    if all(ph in UNSPOKEN for c in results for ph in c.phones):
        phones = " ".join(ph for c in results for ph in c.phones)
        raise NothingToSpeakError(f"nothing speakable as {lang!r} in {text[:80]!r} (its phones are only "
                                  f"punctuation: {phones[:40]!r}); send it with its own language", language=lang)
    chunks = [TextChunk(np.asarray(c.phone_ids, dtype=np.int32), None, c.norm_text, c, c.text) for c in results]
    fill_bert(chunks, 0, spec, models, timer, upto=bert_upto)
    return chunks


def fill_bert(chunks: list[TextChunk], start: int, spec: VoiceSpec, models: Models, timer: Timer | None,
              upto: int | None = None) -> None:
    """Give ``chunks[start]`` its BERT features, with those of ``chunks[start:start + upto]`` (all from ``start``
    when ``upto`` is None) that lack them, in one batch; nothing when ``chunks[start]`` has them."""
    if start >= len(chunks) or chunks[start].bert is not None:
        return
    todo = [c for c in chunks[start : None if upto is None else start + upto] if c.bert is None]
    with stage("bert", timer):
        berts = bert_features([c.result for c in todo], spec, models.encoders)
    for c, b in zip(todo, berts):
        c.bert = b


def bert_features(results: list, spec: VoiceSpec, encoders) -> list[np.ndarray]:
    """(1024, n_phones) features per phone result (docs/model.md, "BERT features"): the BERT for Chinese segments,
    zeros for the others; all Chinese segments of all results run in one batch."""
    wanted = [(i, j, seg) for i, r in enumerate(results) for j, seg in enumerate(r.segments) if seg.lang == "zh"]
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
                f"BERT features cover {bert.shape[1]} phones but the text has {len(r.phone_ids)} ({r.norm_text!r})",
                stage="bert",
            )
        berts.append(bert.astype(np.float32, copy=False))
    return berts


def _gpt_inputs(ref, chunk: TextChunk, cfg: SynthesisConfig):
    """The GPT's inputs for one sentence (the prompt's phones/BERT/tokens lead) and its sampling parameters."""
    if ref.prompt_phones is not None:
        phones = np.concatenate([ref.prompt_phones, chunk.phones])
        bert = np.concatenate([ref.prompt_bert, chunk.bert], axis=1)
        prompt = np.asarray(ref.prompt_semantic, dtype=np.int32)[None]
    else:
        phones, bert, prompt = chunk.phones, chunk.bert, None
    params = SamplingParams(
        top_k=cfg.top_k, top_p=cfg.top_p, temperature=cfg.temperature, repetition_penalty=cfg.repetition_penalty
    )
    return phones[None].astype(np.int32), bert[None], prompt, params


def token_stream(models: Models, ref, chunk: TextChunk, cfg: SynthesisConfig, seed: int) -> Iterator[int]:
    """The GPT's tokens for one sentence, one at a time (the prompt's phones/BERT/tokens lead)."""
    phones, bert, prompt, params = _gpt_inputs(ref, chunk, cfg)
    return generate(models.gpt, phones, bert, prompt, params, early_stop_num=models.gpt.args.early_stop_num,
                    seed=seed)


def start_generation(models: Models, ref, chunk: TextChunk, cfg: SynthesisConfig, seed: int):
    """One sentence's :class:`~..models.gpt.generate.Generation`, prefilled now, for a decode batch: the same
    tokens as :func:`token_stream` with the same seed."""
    phones, bert, prompt, params = _gpt_inputs(ref, chunk, cfg)
    return start(models.gpt, phones, bert, prompt, params, early_stop_num=models.gpt.args.early_stop_num, seed=seed)


def batch_width(models: Models, wanted: int) -> int:
    """Rows a decode batch of this voice may step at once: ``wanted`` (``PRIMESPEECH_BATCH``) where the GPT decodes
    with the float16 kernels (a batched step reads each weight once for all rows), else 1 (MLX steps rows one by
    one: nothing to share)."""
    dec = models.gpt.decoder
    if wanted <= 1 or not isinstance(dec, NumpyDecoder) or _kernels(dec.weights()) is None:
        return 1
    return wanted


def next_token(gen: Iterator[int], tokens: list[int], timer: Timer) -> int | None:
    """One step of ``gen`` timed as prefill (first) or decode; None at the end of the sentence."""
    t0 = time.perf_counter()
    with stage("gpt"):
        tok = next(gen, None)
    timer.add("gpt_decode" if tokens else "gpt_prefill", time.perf_counter() - t0)
    return tok


def generate_tokens(models: Models, ref, chunk: TextChunk, cfg: SynthesisConfig, seed: int, timer: Timer,
                    cancel: threading.Event | None = None, limit: int | None = None) -> np.ndarray:
    """All of one sentence's tokens, or its first ``limit``; ``cancel`` is checked before every step."""
    tokens: list[int] = []
    with stage("gpt"):
        gen = token_stream(models, ref, chunk, cfg, seed)
    while limit is None or len(tokens) < limit:
        check_cancel(cancel)
        tok = next_token(gen, tokens, timer)
        if tok is None:
            break
        tokens.append(int(tok))
    return np.asarray(tokens, dtype=np.int32)


def sentence_latent(models: Models, ref, tokens: np.ndarray, phones: np.ndarray, speed: float, noise_scale: float,
                    bank: NoiseBank) -> mx.array:
    """SoVITS up to the vocoder for one whole sentence (upstream ``decode`` before ``dec``): z (1, C, frames)."""
    sovits = models.sovits
    noise = bank.take(0, output_frames(2 * len(tokens), speed)) if noise_scale > 0 else None
    m_p, logs_p, y_mask = sovits.encode(mx.array(np.asarray(tokens, dtype=np.int32)[None, None]),
                                        mx.array(phones[None].astype(np.int32)), ref.ge, speed)
    z_p = sovits.sample_prior(m_p, logs_p, noise_scale, noise=None if noise is None else mx.array(noise))
    z = sovits.flow_reverse(z_p, y_mask, ref.ge)
    mx.eval(z)
    return z


def vocode(models: Models, ref, z: mx.array) -> np.ndarray:
    """The vocoder on a latent (MLX or ONNX Runtime, as the model's backend says), float32 1-D."""
    return np.array(models.sovits.vocode(z, ref.ge)).reshape(-1).astype(np.float32)


class NoiseBank:
    """Standard-normal SoVITS prior noise, (channels, frame) indexed by absolute output frame.

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


def postprocess(audio: np.ndarray, sr: int, fragment_interval: float, normalise: bool = True) -> np.ndarray:
    """Upstream ``audio_postprocess`` for one fragment: /max if max > 1, then the silence."""
    audio = np.asarray(audio, dtype=np.float32)
    if normalise and len(audio):
        peak = float(np.abs(audio).max())
        if peak > 1:
            audio = audio / peak
    return np.concatenate([audio, np.zeros(int(sr * fragment_interval), dtype=np.float32)])
