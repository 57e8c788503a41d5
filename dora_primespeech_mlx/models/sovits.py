"""SoVITS synthesizer (GPT-SoVITS ``module/models.py`` ``SynthesizerTrn``, inference only), v1 and v2.

Public methods keep the PyTorch (B, C, T) convention; inside, activations are (B, T, C). The stages
(gpt-sovits-v2.md section 6) are exposed one by one so the engine can stream:

    ge = model.ref_embedding(spec)                       # (B, gin, 1)
    y = model.encode_features(codes, phones, ge)         # (B, 192, 2T) before the speed change
    x, m_p, logs_p, y_mask = model.project(y, speed)     # prior statistics
    z_p = model.sample_prior(m_p, logs_p, noise_scale, noise=..., seed=...)
    z = model.flow_reverse(z_p, y_mask, ge)
    audio = model.vocode(z, ge, y_mask)                  # (B, 1, 640 * T')

``decode`` runs them all; ``decode_staged`` returns every intermediate.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .common import fold_weight_norm, to_float32
from .conv import Conv1d, conv1d
from .hifigan import Generator
from .sovits_layers import MRTE, Encoder, MelStyleEncoder, ResidualCouplingBlock

SSL_DIM = 768
V2_REF_BINS = 704
N_SYMBOLS = {"v1": 322, "v2": 732}


@dataclass
class SoVITSArgs:
    spec_channels: int = 1025
    inter_channels: int = 192
    hidden_channels: int = 192
    filter_channels: int = 768
    n_heads: int = 2
    n_layers: int = 6
    kernel_size: int = 3
    resblock: str = "1"
    resblock_kernel_sizes: list[int] = field(default_factory=lambda: [3, 7, 11])
    resblock_dilation_sizes: list[list[int]] = field(default_factory=lambda: [[1, 3, 5]] * 3)
    upsample_rates: list[int] = field(default_factory=lambda: [10, 8, 2, 2, 2])
    upsample_initial_channel: int = 512
    upsample_kernel_sizes: list[int] = field(default_factory=lambda: [16, 16, 8, 2, 2])
    gin_channels: int = 512
    semantic_frame_rate: str = "25hz"
    version: str = "v2"
    sampling_rate: int = 32000
    filter_length: int = 2048
    hop_length: int = 640
    win_length: int = 2048
    codebook_size: int = 1024

    @classmethod
    def from_config(cls, config: dict[str, Any], version: str | None = None) -> SoVITSArgs:
        """From a SoVITS ``.pth`` config (sections ``model`` and ``data``, like ``configs/s2.json``).
        ``version`` (from the checkpoint's text embedding) overrides ``model.version``."""
        if "model" not in config:
            raise ValueError("SoVITS config has no 'model' section")
        model, data = config["model"], config.get("data", {})
        fields = {f for f in cls.__dataclass_fields__}
        kwargs = {k: v for k, v in model.items() if k in fields}
        for key in ("sampling_rate", "filter_length", "hop_length", "win_length"):
            if key in data:
                kwargs[key] = int(data[key])
        if "filter_length" in kwargs:
            kwargs["spec_channels"] = kwargs["filter_length"] // 2 + 1
        kwargs["version"] = version or model.get("version") or "v2"
        kwargs["semantic_frame_rate"] = "25hz"  # TTS.init_vits_weights forces it, whatever the config says
        args = cls(**kwargs)
        args.validate()
        return args

    def validate(self) -> None:
        if self.version not in N_SYMBOLS:
            raise ValueError(f"SoVITS version {self.version!r} is not supported (supported: v1, v2)")
        if str(self.resblock) != "1":
            raise ValueError(f"SoVITS resblock {self.resblock!r} is not supported (only '1', as in v1/v2)")
        if self.semantic_frame_rate not in ("25hz", "50hz"):
            raise ValueError(f"semantic_frame_rate {self.semantic_frame_rate!r}: expected '25hz' or '50hz'")
        if self.hidden_channels != 192 or self.gin_channels != 512:
            raise ValueError(
                f"hidden_channels={self.hidden_channels}, gin_channels={self.gin_channels}: the original MRTE "
                "block fixes them to 192 and 512"
            )

    @property
    def n_symbols(self) -> int:
        return N_SYMBOLS[self.version]

    @property
    def ref_bins(self) -> int:
        """Spectrogram bins seen by the reference encoder: all for v1, the first 704 for v2."""
        return self.spec_channels if self.version == "v1" else V2_REF_BINS

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DecodeOutputs:
    """Every stage of ``decode`` in (B, C, T) layout."""

    ge: mx.array
    quantized_50hz: mx.array
    enc_p_x: mx.array
    m_p: mx.array
    logs_p: mx.array
    y_mask: mx.array
    z_p: mx.array
    z: mx.array
    audio: mx.array


def _bct(x: mx.array) -> mx.array:
    """(B, T, C) <-> (B, C, T)."""
    return x.transpose(0, 2, 1)


def _as_mx(x, dtype=None) -> mx.array:
    a = x if isinstance(x, mx.array) else mx.array(np.asarray(x))
    return a.astype(dtype) if dtype is not None and a.dtype != dtype else a


def interpolate_linear(x: mx.array, size: int) -> mx.array:
    """``F.interpolate(mode="linear", align_corners=False)`` along time for x (B, T, C)."""
    length = x.shape[1]
    scale = np.float32(length / size)
    src = (np.arange(size, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5)
    src = np.maximum(src, np.float32(0.0))
    i0 = np.minimum(np.floor(src).astype(np.int32), length - 1)
    i1 = np.minimum(i0 + 1, length - 1)
    lam = mx.array((src - i0).astype(np.float32))[None, :, None]
    return x[:, mx.array(i0)] * (1.0 - lam) + x[:, mx.array(i1)] * lam


class TextEncoder(nn.Module):
    """``enc_p``: SSL stream + phone stream -> MRTE -> prior statistics (m_p, logs_p)."""

    def __init__(self, args: SoVITSArgs):
        super().__init__()
        h, f, heads, n, k = (
            args.hidden_channels,
            args.filter_channels,
            args.n_heads,
            args.n_layers,
            args.kernel_size,
        )
        self.inter_channels = args.inter_channels
        self.ssl_proj = Conv1d(SSL_DIM, h, 1)
        self.encoder_ssl = Encoder(h, f, heads, n // 2, k)
        self.text_embedding = nn.Embedding(args.n_symbols, h)
        self.encoder_text = Encoder(h, f, heads, n, k)
        self.mrte = MRTE(h, args.gin_channels)
        self.encoder2 = Encoder(h, f, heads, n // 2, k)
        self.proj = Conv1d(h, 2 * args.inter_channels, 1)

    def features(self, ssl: mx.array, phones: mx.array, ge: mx.array) -> mx.array:
        """ssl (B, T, 768), phones (B, Tp) int, ge (B, 1, gin) -> (B, T, hidden)."""
        y = self.encoder_ssl(self.ssl_proj(ssl))
        text = self.encoder_text(self.text_embedding(phones))
        return self.encoder2(self.mrte(y, text, ge))

    def project(self, y: mx.array, speed: float = 1.0) -> tuple[mx.array, mx.array, mx.array]:
        """Speed change (linear interpolation to int(T / speed) + 1 frames) and the ``proj`` conv."""
        if speed != 1:
            y = interpolate_linear(y, int(y.shape[1] / speed) + 1)
        stats = self.proj(y)
        return y, stats[..., : self.inter_channels], stats[..., self.inter_channels :]


class Quantizer(nn.Module):
    """The single residual-VQ codebook (1024 x 768) used at inference."""

    def __init__(self, codebook_size: int, dim: int):
        super().__init__()
        self.embed = mx.zeros((codebook_size, dim))

    def encode(self, x: mx.array) -> mx.array:
        """x (B, T, D) -> codes (B, T) int32, nearest codebook row in squared L2 distance."""
        e = self.embed
        dist = -(mx.sum(x * x, axis=-1, keepdims=True) - 2 * (x @ e.T) + mx.sum(e * e, axis=-1))
        return mx.argmax(dist, axis=-1).astype(mx.int32)

    def decode(self, codes: mx.array) -> mx.array:
        return self.embed[codes]


class SoVITSModel(nn.Module):
    vocoder_backend = None  # set by models.vocoder.attach: runs the generator outside MLX (or None)

    def __init__(self, args: SoVITSArgs):
        super().__init__()
        args.validate()
        self.args = args
        self.enc_p = TextEncoder(args)
        self.dec = Generator(
            args.inter_channels,
            args.resblock_kernel_sizes,
            args.resblock_dilation_sizes,
            args.upsample_rates,
            args.upsample_initial_channel,
            args.upsample_kernel_sizes,
            args.gin_channels,
        )
        self.flow = ResidualCouplingBlock(args.inter_channels, args.hidden_channels, 5, 1, 4, args.gin_channels)
        self.ref_enc = MelStyleEncoder(args.ref_bins, args.gin_channels)
        ssl_kernel = 2 if args.semantic_frame_rate == "25hz" else 1
        self.ssl_proj = Conv1d(SSL_DIM, SSL_DIM, ssl_kernel, stride=ssl_kernel)
        self.quantizer = Quantizer(args.codebook_size, SSL_DIM)

    # ----------------------------------------------------------------------------------------------
    # weights

    @staticmethod
    def sanitize(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Original ``.pth`` weights -> this module's names and MLX layouts (float32).

        Drops the posterior encoder (``enc_q.*``) and the quantizer's training buffers, folds weight
        norm, renames the few ``nn.Sequential``/wrapper paths, and transposes conv weights
        (Conv1d (Co, Ci, K) and ConvTranspose1d (Ci, Co, K) -> (Co, K, Ci)).
        """
        kept = {}
        for key, value in weights.items():
            if key.startswith("enc_q."):
                continue
            if key.startswith("quantizer."):
                if not key.endswith("_codebook.embed"):
                    continue
                if not key.startswith("quantizer.vq.layers.0."):
                    continue  # residual layers beyond the first are never used (n_q = 1 at inference)
                kept["quantizer.embed"] = value
                continue
            kept[key] = value
        weights = to_float32(fold_weight_norm(kept))

        out = {}
        for key, value in weights.items():
            new = key
            if new.startswith("flow.flows."):
                idx, rest = new[len("flow.flows.") :].split(".", 1)
                new = f"flow.couplings.{int(idx) // 2}.{rest}"
            elif new.startswith("ref_enc."):
                new = (
                    new.replace("ref_enc.spectral.0.fc.", "ref_enc.spectral_in.")
                    .replace("ref_enc.spectral.3.fc.", "ref_enc.spectral_out.")
                    .replace(".conv1.conv.", ".conv.")
                    .replace("ref_enc.fc.fc.", "ref_enc.fc.")
                )
            if value.ndim == 3 and new.endswith(".weight"):
                if new.startswith("dec.ups."):
                    value = value.transpose(1, 2, 0)  # (Ci, Co, K) -> (Co, K, Ci)
                else:
                    value = value.transpose(0, 2, 1)  # (Co, Ci, K) -> (Co, K, Ci)
            out[new] = np.ascontiguousarray(value)
        return out

    def prepare(self) -> SoVITSModel:
        """Build derived weights (the GEMM layout of the transposed convs) once, ahead of the first call."""
        self.dec.prepare()
        return self

    @property
    def sampling_rate(self) -> int:
        return self.args.sampling_rate

    @property
    def samples_per_frame(self) -> int:
        """Output samples per 50 Hz latent frame (640 for v1/v2)."""
        return self.dec.hop_length

    # ----------------------------------------------------------------------------------------------
    # prompt codes

    def extract_latent(self, ssl, return_intermediates: bool = False):
        """SSL features (B, 768, T) -> codes (B, 1, T // 2) int32.

        With ``return_intermediates`` returns a dict with ``ssl_proj`` (B, 768, T//2), ``codes`` and
        ``quantized`` (B, 768, T//2) instead.
        """
        x = _bct(_as_mx(ssl, mx.float32))
        stride = self.ssl_proj.stride
        proj = conv1d(x, self.ssl_proj.weight, self.ssl_proj.bias, stride=stride)
        codes = self.quantizer.encode(proj)
        codes_b1t = codes[:, None, :]
        if not return_intermediates:
            return codes_b1t
        return {"ssl_proj": _bct(proj), "codes": codes_b1t, "quantized": _bct(self.quantizer.decode(codes))}

    # ----------------------------------------------------------------------------------------------
    # stages of decode

    def ref_embedding(self, spec) -> mx.array:
        """Reference spectrogram (B, spec_channels, F) -> ge (B, gin, 1); a list of spectrograms gives
        the mean of their embeddings."""
        if isinstance(spec, (list, tuple)):
            if not spec:
                raise ValueError("ref_embedding: empty list of reference spectrograms")
            ges = [self.ref_embedding(s) for s in spec]
            return mx.mean(mx.stack(ges, axis=0), axis=0)
        spec = _as_mx(spec, mx.float32)
        if spec.ndim != 3 or spec.shape[1] != self.args.spec_channels:
            raise ValueError(
                f"reference spectrogram has shape {tuple(spec.shape)}, expected (B, {self.args.spec_channels}, F)"
            )
        x = _bct(spec[:, : self.args.ref_bins])
        return self.ref_enc(x)[:, :, None]

    def _resolve_ge(self, refer, ge) -> mx.array:
        if ge is not None:
            return _as_mx(ge, mx.float32)
        if refer is None:
            raise ValueError("decode needs a reference spectrogram (refer) or a ge embedding")
        if not isinstance(refer, (list, tuple)):
            r = _as_mx(refer, mx.float32)
            if r.ndim == 3 and r.shape[1] == self.args.gin_channels and r.shape[2] == 1:
                return r  # already an embedding
            refer = r
        return self.ref_embedding(refer)

    def quantized_50hz(self, codes) -> mx.array:
        """Codes (B, 1, T) -> codebook vectors at 50 Hz, internal layout (B, 2T, 768)."""
        codes = _as_mx(codes, mx.int32)
        if codes.ndim != 3 or codes.shape[1] != 1:
            raise ValueError(f"codes have shape {tuple(codes.shape)}, expected (B, 1, T)")
        q = self.quantizer.decode(codes[:, 0])
        if self.args.semantic_frame_rate == "25hz":
            q = mx.repeat(q, 2, axis=1)
        return q

    def encode_features(self, codes, phones, ge) -> mx.array:
        """``enc_p`` up to ``encoder2`` (before the speed change): -> (B, hidden, 2T)."""
        return _bct(self._features(self.quantized_50hz(codes), phones, ge))

    def _features(self, quantized: mx.array, phones, ge) -> mx.array:
        phones = _as_mx(phones, mx.int32)
        if phones.ndim == 1:
            phones = phones[None]
        ge_btc = _bct(_as_mx(ge, mx.float32))
        return self.enc_p.features(quantized, phones, ge_btc)

    def project(self, y, speed: float = 1.0) -> tuple[mx.array, mx.array, mx.array, mx.array]:
        """Features (B, hidden, T) -> (x, m_p, logs_p, y_mask) after the speed change (T' frames)."""
        x, m_p, logs_p = self.enc_p.project(_bct(_as_mx(y, mx.float32)), speed)
        y_mask = mx.ones((x.shape[0], 1, x.shape[1]), dtype=mx.float32)
        return _bct(x), _bct(m_p), _bct(logs_p), y_mask

    def encode(self, codes, phones, ge, speed: float = 1.0) -> tuple[mx.array, mx.array, mx.array]:
        """Prior statistics: -> (m_p, logs_p, y_mask), each (B, C, T')."""
        _, m_p, logs_p, y_mask = self.project(self.encode_features(codes, phones, ge), speed)
        return m_p, logs_p, y_mask

    @staticmethod
    def sample_prior(m_p, logs_p, noise_scale: float = 0.5, noise=None, seed: int | None = None) -> mx.array:
        """``z_p = m_p + noise * exp(logs_p) * noise_scale``. ``noise`` (same shape as m_p) is replayed
        when given; otherwise it is drawn from MLX's generator (seeded with ``seed`` when given)."""
        m_p, logs_p = _as_mx(m_p, mx.float32), _as_mx(logs_p, mx.float32)
        if noise_scale == 0:
            return m_p
        if noise is None:
            key = mx.random.key(seed) if seed is not None else None
            noise = mx.random.normal(m_p.shape, dtype=mx.float32, key=key)
        else:
            noise = _as_mx(noise, mx.float32)
            if tuple(noise.shape) != tuple(m_p.shape):
                raise ValueError(f"noise has shape {tuple(noise.shape)}, expected {tuple(m_p.shape)}")
        return m_p + noise * mx.exp(logs_p) * noise_scale

    def flow_reverse(self, z_p, y_mask, ge) -> mx.array:
        """Flow run backwards: z_p (B, inter, T) -> z (B, inter, T)."""
        z = self.flow(_bct(_as_mx(z_p, mx.float32)), _bct(_as_mx(ge, mx.float32)), reverse=True)
        return _bct(z) * _as_mx(y_mask, mx.float32) if y_mask is not None else _bct(z)

    def vocode(self, z, ge, y_mask=None) -> mx.array:
        """Generator: z (B, inter, T) -> audio (B, 1, T * samples_per_frame) in [-1, 1]."""
        z = _as_mx(z, mx.float32)
        if y_mask is not None:
            z = z * _as_mx(y_mask, mx.float32)
        backend = self.vocoder_backend  # ONNX Runtime on CPU-only machines (vocoder.attach), else None
        if backend is not None:
            audio = backend.run(z, _as_mx(ge, mx.float32))
            if audio is not None:
                return mx.array(audio)
        return _bct(self.dec(_bct(z), _bct(_as_mx(ge, mx.float32))))

    # ----------------------------------------------------------------------------------------------
    # full decode

    def decode_staged(
        self,
        codes,
        phones,
        refer=None,
        noise_scale: float = 0.5,
        speed: float = 1.0,
        noise=None,
        *,
        ge=None,
        seed: int | None = None,
    ) -> DecodeOutputs:
        """``decode`` returning every intermediate (see :class:`DecodeOutputs`)."""
        ge = self._resolve_ge(refer, ge)
        quantized = self.quantized_50hz(codes)
        y = self._features(quantized, phones, ge)
        x, m_p, logs_p, y_mask = self.project(_bct(y), speed)
        z_p = self.sample_prior(m_p, logs_p, noise_scale, noise=noise, seed=seed)
        z = self.flow_reverse(z_p, y_mask, ge)
        audio = self.vocode(z, ge, y_mask)
        return DecodeOutputs(ge, _bct(quantized), x, m_p, logs_p, y_mask, z_p, z, audio)

    def decode(
        self,
        codes,
        phones,
        refer=None,
        noise_scale: float = 0.5,
        speed: float = 1.0,
        noise=None,
        *,
        ge=None,
        seed: int | None = None,
    ) -> mx.array:
        """Semantic codes (B, 1, T) + phones (B, Tp) + reference -> audio (B, 1, 1280 T / speed approx.).

        ``refer``: a reference spectrogram (B, spec_channels, F), a list of them (their embeddings are
        averaged), or a ready ``ge`` (B, gin, 1); or pass ``ge=`` explicitly.
        """
        ge = self._resolve_ge(refer, ge)
        m_p, logs_p, y_mask = self.encode(codes, phones, ge, speed)
        z_p = self.sample_prior(m_p, logs_p, noise_scale, noise=noise, seed=seed)
        return self.vocode(self.flow_reverse(z_p, y_mask, ge), ge, y_mask)


def load_sovits(raw) -> SoVITSModel:
    """A ready model from a :class:`~dora_primespeech_mlx.convert.checkpoints.RawCheckpoint` (``read_sovits``)."""
    args = SoVITSArgs.from_config(raw.config, version=getattr(raw, "version", None))
    model = SoVITSModel(args)
    weights = SoVITSModel.sanitize(raw.weights)
    n_emb = weights.get("enc_p.text_embedding.weight")
    if n_emb is not None and n_emb.shape[0] != args.n_symbols:
        raise ValueError(
            f"{getattr(raw, 'path', 'SoVITS checkpoint')}: text embedding has {n_emb.shape[0]} rows, "
            f"expected {args.n_symbols} for {args.version}"
        )
    try:
        model.load_weights([(k, mx.array(v)) for k, v in weights.items()], strict=True)
    except ValueError as e:
        raise ValueError(f"{getattr(raw, 'path', 'SoVITS checkpoint')}: weights do not fit the config: {e}") from e
    model.eval()
    mx.eval(model.parameters())
    return model.prepare()
