"""The reference side of a voice (docs/model.md, "Reference features"), computed once per voice and cached:
the clip at the SoVITS rate -> spectrogram -> ``ge``; the clip at 16 kHz -> CNHubert -> prompt semantic tokens;
the transcript -> prompt phones and their BERT features. :class:`ReferenceBuilder` owns the recipe; its
``load_16k`` and ``prompt_semantic`` steps are methods so tests can replay the original's arrays."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from .. import text as text_mod
from ..assets.catalog import VoiceSpec, check_prompt_text
from ..errors import ConfigError
from ..models import audio
from ..models.sv.model import speaker_embedding
from ..text.options import TextData
from .pipeline import Models, bert_features
from .stats import Timer, stage

REF_MIN_SECONDS, REF_MAX_SECONDS = 3.0, 10.0  # upstream: 48000 <= len(wav16k) <= 160000
HUBERT_SR = 16000


@dataclass
class Reference:
    prompt_semantic: np.ndarray | None  # (Ty,) int32; None in reference-free mode
    prompt_phones: np.ndarray | None  # (n,) int32
    prompt_bert: np.ndarray | None  # (1024, n) float32
    prompt_norm_text: str
    ge: mx.array  # (1, gin, 1)
    seconds: float


def _length_error(path, seconds: float) -> ConfigError:
    return ConfigError(f"reference audio {path} is {seconds:.2f} s long; GPT-SoVITS needs a "
                       f"{REF_MIN_SECONDS:g}-{REF_MAX_SECONDS:g} s clip (cut or replace it)")


class ReferenceBuilder:
    """Computes a voice's :class:`Reference` (the engine caches it; see ``engine.cache``)."""

    def build(self, spec: VoiceSpec, models: Models, prompt_lang: str, timer: Timer,
              text_data: TextData) -> Reference:
        """The reference of ``spec``; its prompt text is phonemised with ``text_data`` (the engine's)."""
        check_prompt_text(spec.prompt_text or "", f"voice {spec.name!r}")  # before any work on the voice
        with stage("reference", timer):
            wav32k, wav16k = self.load(spec.reference, models.sovits)
            seconds = len(wav16k) / HUBERT_SR
            if not REF_MIN_SECONDS <= seconds <= REF_MAX_SECONDS:
                raise _length_error(spec.reference, seconds)
            ge = self.ref_embedding(models.sovits, wav32k, self.sv_embedding(models, wav32k))
        # an empty prompt text means reference-free mode (docs/model.md, "Reference-free mode"): no prompt at all
        with stage("text", timer):
            result = text_mod.prompt_phones(spec.prompt_text or "", prompt_lang, models.symbol_version,
                                            data=text_data)
        if result is None:
            return Reference(None, None, None, "", ge, seconds)
        # CNHubert's forward before RoBERTa loads: its activations are the loading's peak (docs/memory.md)
        with stage("reference", timer):
            semantic = self.prompt_semantic(models, wav16k)
        with stage("bert", timer):
            bert = bert_features([result], spec, models.encoders)[0]
        return Reference(semantic, np.asarray(result.phone_ids, dtype=np.int32), bert, result.norm_text, ge, seconds)

    def load(self, path: Path, sovits) -> tuple[np.ndarray, np.ndarray]:
        """(wav at the SoVITS rate for the spectrogram, wav at 16 kHz for HuBERT), both mono float32."""
        try:  # refused from its header when over REF_MAX_SECONDS: nothing of a long file is decoded
            wav, sr = audio.load_wav(path, max_seconds=REF_MAX_SECONDS)
        except audio.ClipTooLongError as exc:
            raise _length_error(path, exc.seconds) from None
        except ValueError as exc:
            raise ConfigError(f"reference audio of the voice: {exc}") from None
        wav = np.asarray(wav, dtype=np.float32)
        target = int(sovits.sampling_rate)
        wav32k = wav if sr == target else audio.resample(wav, sr, target)
        peak = float(np.abs(wav32k).max()) if len(wav32k) else 0.0
        if peak > 1:  # upstream _get_ref_spec: divide by min(2, max)
            wav32k = wav32k / min(2.0, peak)
        wav16k = self.load_16k(path, wav, sr)
        return np.asarray(wav32k, dtype=np.float32), np.asarray(wav16k, dtype=np.float32)

    def load_16k(self, path: Path, wav: np.ndarray, sr: int) -> np.ndarray:
        """The HuBERT input before the 0.6 s tail (librosa.load(sr=16000) upstream: soxr HQ)."""
        return wav if sr == HUBERT_SR else audio.resample(wav, sr, HUBERT_SR)

    @staticmethod
    def ref_embedding(sovits, wav32k: np.ndarray, sv_emb=None) -> mx.array:
        """``ge`` (1, gin, 1) from the clip's spectrogram (v2Pro: also conditioned on the sv embedding)."""
        a = sovits.args
        spec = audio.spectrogram(wav32k, a.filter_length, a.hop_length, a.win_length)
        ge = sovits.ref_embedding(mx.array(spec), sv_emb=sv_emb)
        mx.eval(ge)
        return ge

    @staticmethod
    def sv_embedding(models: Models, wav32k: np.ndarray):
        """None for v1/v2; for v2Pro / v2ProPlus the speaker-verification embedding (1, D) of the clip (upstream:
        the SoVITS-rate clip after the peak normalisation, resampled to 16 kHz, Kaldi fbank, ERes2NetV2)."""
        if models.sv is None:
            return None
        return speaker_embedding(models.sv, wav32k, models.sample_rate)

    def prompt_semantic(self, models: Models, wav16k: np.ndarray) -> np.ndarray:
        ssl = models.encoders.hubert_features(wav16k)  # appends the 0.6 s zero tail; (1, 768, T)
        codes = models.sovits.extract_latent(mx.array(ssl))
        return np.array(codes[0, 0]).astype(np.int32)
