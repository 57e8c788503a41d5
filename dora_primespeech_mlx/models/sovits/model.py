"""SoVITS synthesizer (GPT-SoVITS ``module/models.py`` ``SynthesizerTrn``, inference only): v1, v2, v2Pro
and v2ProPlus.

Public methods keep the PyTorch (B, C, T) convention; inside, activations are (B, T, C). The stages (docs/model.md,
"SoVITS: tokens to audio") are exposed one by one so the engine can stream windows of tokens onto one fixed output grid;
:class:`SoVITSModel` shows the calls. v2Pro / v2ProPlus (one code path; only their configs differ) also condition on a
speaker-verification embedding of each reference (``models/sv/model.py``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..shared.common import fold_weight_norm, to_float32
from .conv import Conv1d, conv1d, set_impl
from .hifigan import Generator
from .layers import MRTE, Encoder, MelStyleEncoder, ResidualCouplingBlock

SSL_DIM = 768
V2_REF_BINS = 704
FRAMES_PER_TOKEN = 2  # 25 Hz semantic tokens -> 50 Hz latent frames (quantized_50hz)
MRTE_HIDDEN = 512  # MRTE's width, fixed by the original (v1/v2 feed it ge directly, so gin must be 512 there)
N_SYMBOLS = {"v1": 322, "v2": 732, "v2Pro": 732, "v2ProPlus": 732}
V2PRO_VERSIONS = ("v2Pro", "v2ProPlus")


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
    sv_dim: int = 20480  # v2Pro family: width of the speaker-verification embedding (sv_emb's input)

    @classmethod
    def from_config(
        cls, config: dict[str, Any], version: str | None = None, weights: dict[str, Any] | None = None
    ) -> SoVITSArgs:
        """From a SoVITS ``.pth`` config (sections ``model`` and ``data``, like ``configs/s2.json``).
        ``version`` (detected from the file) overrides ``model.version``; ``weights`` (the checkpoint's)
        give the v2Pro ``sv_dim`` (``sv_emb.weight``'s input width, never assumed)."""
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
        if weights is not None and "sv_emb.weight" in weights:
            kwargs["sv_dim"] = int(weights["sv_emb.weight"].shape[1])
        args = cls(**kwargs)
        args.validate()
        return args

    def validate(self) -> None:
        if self.version not in N_SYMBOLS:
            raise ValueError(
                f"SoVITS version {self.version!r} is not supported (supported: {', '.join(N_SYMBOLS)})"
            )
        if str(self.resblock) != "1":
            raise ValueError(f"SoVITS resblock {self.resblock!r} is not supported (only '1', as in v1/v2)")
        if self.semantic_frame_rate not in ("25hz", "50hz"):
            raise ValueError(f"semantic_frame_rate {self.semantic_frame_rate!r}: expected '25hz' or '50hz'")
        if self.hidden_channels != 192 or (self.gin_channels != MRTE_HIDDEN and not self.is_v2pro):
            raise ValueError(
                f"hidden_channels={self.hidden_channels}, gin_channels={self.gin_channels}: the original MRTE "
                f"block fixes them to 192 and {MRTE_HIDDEN} (gin is free only for v2Pro/v2ProPlus)"
            )

    def check_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Refuse sanitized weights of another version (the phone table's size tells v1 from v2)."""
        emb = weights.get("enc_p.text_embedding.weight")
        if emb is not None and emb.shape[0] != self.n_symbols:
            raise ValueError(f"text embedding has {emb.shape[0]} rows, expected {self.n_symbols} for {self.version}")

    @property
    def is_v2pro(self) -> bool:
        """v2Pro / v2ProPlus: conditioned on a speaker-verification embedding as well."""
        return self.version in V2PRO_VERSIONS

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
    ge512: mx.array  # what MRTE adds: ge_to512(ge) for v2Pro, ge itself for v1/v2
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


def output_frames(frames: int, speed: float) -> int:
    """Output frames after the speed change of ``frames`` 50 Hz feature frames (``FRAMES_PER_TOKEN`` per
    semantic token): unchanged at speed 1, else upstream's ``int(frames / speed) + 1`` (the one place this
    formula lives)."""
    return frames if speed == 1 else int(frames / speed) + 1


def grid_frame(token: int, speed: float) -> int:
    """Output frame at which token boundary ``token`` falls on a sentence's fixed output grid (frame ``i``
    samples the 50 Hz features at ``(i + 0.5) * speed - 0.5``, the nominal ratio: :func:`grid_positions`).
    The grid a streamed sentence is decoded on, window by window."""
    return FRAMES_PER_TOKEN * token if speed == 1 else round(FRAMES_PER_TOKEN * token / speed)


def grid_positions(f0: int, f1: int, speed: float, first_token: int, length: int) -> np.ndarray:
    """Source positions of output frames [f0, f1) of a sentence's fixed grid in the features of a window
    of ``length`` 50 Hz frames that begins at token ``first_token``, clipped to the window."""
    src = (np.arange(f0, f1) + 0.5) * speed - 0.5 - FRAMES_PER_TOKEN * first_token
    return np.clip(src, 0, length - 1)


def interpolate_at(x: mx.array, src: np.ndarray, axis: int = 1) -> mx.array:
    """Linear interpolation of ``x`` along ``axis`` (time; default: x is (B, T, C)) at fractional source
    positions ``src``: the one implementation of the speed change, for whole sentences
    (:func:`interpolate_linear`) and streamed windows (positions from :func:`grid_positions`). Positions
    below 0 read frame 0; beyond the last frame the indices are clamped as torch clamps them."""
    length = x.shape[axis]
    src = np.maximum(src, 0)
    i0 = np.minimum(np.floor(src).astype(np.int32), length - 1)
    i1 = np.minimum(i0 + 1, length - 1)
    shape = [1] * x.ndim
    shape[axis] = -1
    lam = mx.array((src - i0).astype(np.float32)).reshape(shape)
    lead = (slice(None),) * axis
    return x[(*lead, mx.array(i0))] * (1.0 - lam) + x[(*lead, mx.array(i1))] * lam


def interpolate_linear(x: mx.array, size: int) -> mx.array:
    """``F.interpolate(mode="linear", align_corners=False)`` along time for x (B, T, C): ``size`` frames at
    positions ``(i + 0.5) * T / size - 0.5`` (float32, as torch computes them)."""
    scale = np.float32(x.shape[1] / size)
    return interpolate_at(x, (np.arange(size, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5))


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
        self.mrte = MRTE(h, MRTE_HIDDEN)
        self.encoder2 = Encoder(h, f, heads, n // 2, k)
        self.proj = Conv1d(h, 2 * args.inter_channels, 1)

    def text_features(self, phones: mx.array) -> mx.array:
        """The phone stream alone: phones (B, Tp) int -> (B, Tp, hidden); depends on nothing else."""
        return self.encoder_text(self.text_embedding(phones))

    def features(self, ssl: mx.array, phones: mx.array, ge: mx.array, text: mx.array | None = None) -> mx.array:
        """ssl (B, T, 768), phones (B, Tp) int, ge (B, 1, gin) -> (B, T, hidden). ``text``: the phones'
        :meth:`text_features` when already computed (streamed windows of one sentence share them)."""
        y = self.encoder_ssl(self.ssl_proj(ssl))
        if text is None:
            text = self.text_features(phones)
        return self.encoder2(self.mrte(y, text, ge))

    def project(self, y: mx.array, speed: float = 1.0) -> tuple[mx.array, mx.array, mx.array]:
        """Speed change (linear interpolation to :func:`output_frames` frames) and the ``proj`` conv."""
        if speed != 1:
            y = interpolate_linear(y, output_frames(y.shape[1], speed))
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
    """The synthesizer, stage by stage::

        ge = model.ref_embedding(spec)                       # (B, gin, 1)
        y = model.encode_features(codes, phones, ge)         # (B, 192, 2T) before the speed change
        x, m_p, logs_p, y_mask = model.project(y, speed)     # prior statistics, output_frames(2T, speed) frames
        z_p = model.sample_prior(m_p, logs_p, noise_scale, noise=..., seed=...)
        z = model.flow_reverse(z_p, y_mask, ge)
        audio = model.vocode(z, ge, y_mask)                  # (B, 1, 640 * T')

    ``decode`` runs them all; ``decode_staged`` returns every intermediate. A streamed sentence decodes
    windows of tokens onto one fixed output grid instead of each window's own speed change::

        y = model.encode_features(codes[..., start:end], phones, ge)  # (B, 192, 2 (end - start))
        f0, f1 = grid_frame(start, speed), grid_frame(end, speed)    # last window: output_frames(2 * end, speed)
        if speed != 1:
            y = interpolate_at(y, grid_positions(f0, f1, speed, start, y.shape[2]), axis=2)
        x, m_p, logs_p, y_mask = model.project(y, 1.0)

    v2Pro / v2ProPlus: ``ref_embedding(spec, sv_emb=e)`` gives ``ge = prelu(ref_enc(spec) + sv_emb_linear(e))``
    (gin wide; several references are averaged after the PReLU), and the TextEncoder's MRTE gets ``ge_to512(ge)``
    instead of ``ge``. That projection happens inside ``encode_features`` / ``decode``, so callers pass the same
    gin-wide ``ge`` to every stage, as for v2."""

    vocoder_backend = None  # runs the generator outside MLX (vocoder.build; given by use_vocoder), or None: MLX

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
        if args.is_v2pro:
            self.sv_emb = nn.Linear(args.sv_dim, args.gin_channels)
            self.ge_to512 = nn.Linear(args.gin_channels, MRTE_HIDDEN)
            self.prelu = nn.PReLU(args.gin_channels)

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

    def prepare(self, conv_impl: str = "auto") -> SoVITSModel:
        """Ready for inference (the loader calls this with the runtime's ``conv_impl``): every convolution takes
        that form (``conv.set_impl``), and derived weights (the GEMM layout of the transposed convs) are built
        once, ahead of the first call."""
        self.conv_impl = set_impl(self, conv_impl)
        self.dec.prepare()
        return self

    @property
    def sampling_rate(self) -> int:
        return self.args.sampling_rate

    @property
    def needs_sv(self) -> bool:
        """True for v2Pro / v2ProPlus: ``ref_embedding`` needs the reference's speaker-verification embedding."""
        return self.args.is_v2pro

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
        proj = conv1d(x, self.ssl_proj.weight, self.ssl_proj.bias, stride=stride, impl=self.ssl_proj.impl)
        codes = self.quantizer.encode(proj)
        codes_b1t = codes[:, None, :]
        if not return_intermediates:
            return codes_b1t
        return {"ssl_proj": _bct(proj), "codes": codes_b1t, "quantized": _bct(self.quantizer.decode(codes))}

    # ----------------------------------------------------------------------------------------------
    # stages of decode

    def ref_embedding(self, spec, sv_emb=None) -> mx.array:
        """Reference spectrogram (B, spec_channels, F) -> ge (B, gin, 1); a list of spectrograms gives
        the mean of their embeddings.

        v2Pro / v2ProPlus need ``sv_emb``: the reference's speaker-verification embedding (B, D_sv)
        (``models.sv.model.speaker_embedding``), or a list of them, one per spectrogram; then
        ``ge = prelu(style + sv_emb_linear(sv_emb))``, averaged over references after the PReLU."""
        if self.needs_sv and sv_emb is None:
            raise ValueError(
                f"a {self.args.version} SoVITS needs the reference's speaker-verification embedding (sv_emb)"
            )
        if isinstance(spec, (list, tuple)):
            if not spec:
                raise ValueError("ref_embedding: empty list of reference spectrograms")
            if self.needs_sv:
                if not isinstance(sv_emb, (list, tuple)) or len(sv_emb) != len(spec):
                    raise ValueError("ref_embedding: give one sv embedding per reference spectrogram")
                ges = [self.ref_embedding(s, e) for s, e in zip(spec, sv_emb)]
            else:
                ges = [self.ref_embedding(s) for s in spec]
            return mx.mean(mx.stack(ges, axis=0), axis=0)
        ge = self.style_embedding(spec)
        if not self.needs_sv:
            return ge
        if isinstance(sv_emb, (list, tuple)):
            if len(sv_emb) != 1:
                raise ValueError("ref_embedding: one spectrogram but several sv embeddings")
            sv_emb = sv_emb[0]
        return _bct(self.prelu(_bct(ge + self.sv_projection(sv_emb)[:, :, None])))

    def sv_projection(self, sv_emb) -> mx.array:
        """v2Pro: the ``sv_emb`` Linear applied to a speaker-verification embedding (B, D_sv) -> (B, gin)."""
        e = _as_mx(sv_emb, mx.float32)
        if e.ndim == 1:
            e = e[None]
        if e.ndim != 2 or e.shape[1] != self.args.sv_dim:
            raise ValueError(f"sv embedding has shape {tuple(e.shape)}, expected (B, {self.args.sv_dim})")
        return self.sv_emb(e)

    def mrte_ge(self, ge) -> mx.array:
        """The conditioning MRTE adds, (B, C, 1): ``ge_to512(ge)`` for v2Pro, ``ge`` itself for v1/v2."""
        ge = _as_mx(ge, mx.float32)
        return _bct(self.ge_to512(_bct(ge))) if self.needs_sv else ge

    def style_embedding(self, spec) -> mx.array:
        """The MelStyleEncoder alone: reference spectrogram (B, spec_channels, F) -> (B, gin, 1) (the
        whole ``ge`` of v1/v2; v2Pro adds the speaker-verification term to it)."""
        spec = _as_mx(spec, mx.float32)
        if spec.ndim != 3 or spec.shape[1] != self.args.spec_channels:
            raise ValueError(
                f"reference spectrogram has shape {tuple(spec.shape)}, expected (B, {self.args.spec_channels}, F)"
            )
        x = _bct(spec[:, : self.args.ref_bins])
        return self.ref_enc(x)[:, :, None]

    def _resolve_ge(self, refer, ge, sv_emb=None) -> mx.array:
        if ge is not None:
            return _as_mx(ge, mx.float32)
        if refer is None:
            raise ValueError("decode needs a reference spectrogram (refer) or a ge embedding")
        if not isinstance(refer, (list, tuple)):
            r = _as_mx(refer, mx.float32)
            if r.ndim == 3 and r.shape[1] == self.args.gin_channels and r.shape[2] == 1:
                return r  # already an embedding
            refer = r
        return self.ref_embedding(refer, sv_emb)

    def quantized_50hz(self, codes) -> mx.array:
        """Codes (B, 1, T) -> codebook vectors at 50 Hz, internal layout (B, 2T, 768)."""
        codes = _as_mx(codes, mx.int32)
        if codes.ndim != 3 or codes.shape[1] != 1:
            raise ValueError(f"codes have shape {tuple(codes.shape)}, expected (B, 1, T)")
        q = self.quantizer.decode(codes[:, 0])
        if self.args.semantic_frame_rate == "25hz":
            q = mx.repeat(q, 2, axis=1)
        return q

    def encode_features(self, codes, phones, ge, text: mx.array | None = None) -> mx.array:
        """``enc_p`` up to ``encoder2`` (before the speed change): -> (B, hidden, 2T). ``text``: the phones'
        ``enc_p.text_features`` when already computed."""
        return _bct(self._features(self.quantized_50hz(codes), phones, ge, text))

    def _features(self, quantized: mx.array, phones, ge, text: mx.array | None = None) -> mx.array:
        phones = _as_mx(phones, mx.int32)
        if phones.ndim == 1:
            phones = phones[None]
        ge_btc = _bct(self.mrte_ge(ge))
        return self.enc_p.features(quantized, phones, ge_btc, text)

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

    def use_vocoder(self, backend) -> SoVITSModel:
        """Run the generator on ``backend`` from now on (a ``vocoder.VocoderBackend``; None: MLX). Returns self."""
        self.vocoder_backend = backend
        return self

    def vocode(self, z, ge, y_mask=None) -> mx.array:
        """Generator: z (B, inter, T) -> audio (B, 1, T * samples_per_frame) in [-1, 1]."""
        z = _as_mx(z, mx.float32)
        if y_mask is not None:
            z = z * _as_mx(y_mask, mx.float32)
        backend = self.vocoder_backend  # ONNX Runtime on CPU-only machines (vocoder.build), else None
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
        sv_emb=None,
    ) -> DecodeOutputs:
        """``decode`` returning every intermediate (see :class:`DecodeOutputs`)."""
        ge = self._resolve_ge(refer, ge, sv_emb)
        quantized = self.quantized_50hz(codes)
        y = self._features(quantized, phones, ge)
        x, m_p, logs_p, y_mask = self.project(_bct(y), speed)
        z_p = self.sample_prior(m_p, logs_p, noise_scale, noise=noise, seed=seed)
        z = self.flow_reverse(z_p, y_mask, ge)
        audio = self.vocode(z, ge, y_mask)
        return DecodeOutputs(ge, self.mrte_ge(ge), _bct(quantized), x, m_p, logs_p, y_mask, z_p, z, audio)

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
        sv_emb=None,
    ) -> mx.array:
        """Semantic codes (B, 1, T) + phones (B, Tp) + reference -> audio (B, 1, 1280 T / speed approx.).

        ``refer``: a reference spectrogram (B, spec_channels, F), a list of them (their embeddings are
        averaged), or a ready ``ge`` (B, gin, 1); or pass ``ge=`` explicitly. v2Pro / v2ProPlus with a
        spectrogram ``refer`` also need ``sv_emb`` (one (B, D_sv) embedding, or a list, one per spectrogram).
        """
        ge = self._resolve_ge(refer, ge, sv_emb)
        m_p, logs_p, y_mask = self.encode(codes, phones, ge, speed)
        z_p = self.sample_prior(m_p, logs_p, noise_scale, noise=noise, seed=seed)
        return self.vocode(self.flow_reverse(z_p, y_mask, ge), ge, y_mask)
