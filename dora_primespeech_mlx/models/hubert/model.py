"""CNHubert content encoder: Hugging Face ``HubertModel`` (base, "group"-norm feature extractor, post-LN).

GPT-SoVITS feeds the **raw** 16 kHz waveform in [-1, 1] (no zero-mean / unit-variance normalisation)
with 9600 zeros (0.6 s) appended, and hands ``last_hidden_state`` transposed to (B, 768, T) to
SoVITS ``extract_latent`` (docs/model.md, "Reference features"). :func:`prompt_features` does exactly
that. The math is in :class:`HubertModel`'s docstring, the converted weights' names and layouts (what the CoreML
export reads) in :meth:`HubertModel.sanitize`'s."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..shared.activations import gelu
from ..shared.common import fold_weight_norm, to_float32
from ..shared.storage import half_storage

# GPT-SoVITS appends int(32000 * 0.3) zeros to the 16 kHz reference (0.6 s, docs/model.md, "Reference features").
PROMPT_TAIL_SAMPLES = 9600


@dataclass
class HubertArgs:
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    conv_dim: list[int] = field(default_factory=lambda: [512] * 7)
    conv_kernel: list[int] = field(default_factory=lambda: [10, 3, 3, 3, 3, 2, 2])
    conv_stride: list[int] = field(default_factory=lambda: [5, 2, 2, 2, 2, 2, 2])
    conv_bias: bool = False
    num_conv_pos_embeddings: int = 128
    num_conv_pos_embedding_groups: int = 16
    layer_norm_eps: float = 1e-5
    feat_extract_norm: str = "group"
    feat_proj_layer_norm: bool = True
    do_stable_layer_norm: bool = False
    conv_pos_batch_norm: bool = False
    hidden_act: str = "gelu"
    feat_extract_activation: str = "gelu"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> HubertArgs:
        """Build from a Hugging Face ``config.json`` dict (``HubertConfig``); unknown keys are ignored."""
        names = cls.__dataclass_fields__
        args = cls(**{k: v for k, v in config.items() if k in names})
        args.conv_dim, args.conv_kernel, args.conv_stride = (
            list(args.conv_dim),
            list(args.conv_kernel),
            list(args.conv_stride),
        )
        args.validate()
        return args

    def validate(self) -> None:
        problems = []
        if self.feat_extract_norm != "group":
            problems.append(f"feat_extract_norm={self.feat_extract_norm!r} (only 'group' is supported)")
        if self.do_stable_layer_norm:
            problems.append("do_stable_layer_norm=true (only the post-LN base variant is supported)")
        if self.conv_pos_batch_norm:
            problems.append("conv_pos_batch_norm=true is not supported")
        if not self.feat_proj_layer_norm:
            problems.append("feat_proj_layer_norm=false is not supported")
        for name in ("hidden_act", "feat_extract_activation"):
            if getattr(self, name) != "gelu":
                problems.append(f"{name}={getattr(self, name)!r} (only 'gelu' is supported)")
        if not (len(self.conv_dim) == len(self.conv_kernel) == len(self.conv_stride)):
            problems.append("conv_dim, conv_kernel and conv_stride differ in length")
        d = self.hidden_size
        if d % self.num_attention_heads or d % self.num_conv_pos_embedding_groups:
            problems.append("hidden_size is not divisible by num_attention_heads / pos-conv groups")
        if problems:
            raise ValueError("unsupported HuBERT config: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def num_frames(self, n_samples: int) -> int:
        """Output frames for ``n_samples`` input samples (no padding anywhere in the conv stack)."""
        n = int(n_samples)
        for k, s in zip(self.conv_kernel, self.conv_stride):
            n = (n - k) // s + 1
            if n < 1:
                return 0
        return n

    @property
    def receptive_field(self) -> int:
        """Samples needed for one output frame (400 for the base kernels)."""
        r = 1
        for k, s in reversed(list(zip(self.conv_kernel, self.conv_stride))):
            r = (r - 1) * s + k
        return r


@dataclass
class HubertOutput:
    """Every intermediate, channels-last: ``conv_features`` is (B, T, conv_dim[-1]) (HF has (B, C, T))."""

    last_hidden_state: mx.array
    hidden_states: list[mx.array]  # num_hidden_layers + 1 entries; [0] is after pos-conv + LayerNorm
    conv_features: mx.array
    projected_features: mx.array
    pos_conv: mx.array


class ConvLayer(nn.Module):
    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, bias: bool, group_norm: bool):
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, stride=stride, bias=bias)
        if group_norm:
            # one group per channel: each channel normalised over time (torch GroupNorm default eps)
            self.layer_norm = nn.GroupNorm(c_out, c_out, eps=1e-5, affine=True, pytorch_compatible=True)

    def __call__(self, x: mx.array) -> mx.array:
        x = self.conv(x)
        if "layer_norm" in self:
            x = self.layer_norm(x)
        return gelu(x)


class FeatureExtractor(nn.Module):
    def __init__(self, args: HubertArgs):
        super().__init__()
        dims = [1, *args.conv_dim]
        self.conv_layers = [
            ConvLayer(dims[i], dims[i + 1], k, s, args.conv_bias, group_norm=(i == 0))
            for i, (k, s) in enumerate(zip(args.conv_kernel, args.conv_stride))
        ]

    def __call__(self, wav: mx.array) -> mx.array:
        x = wav[:, :, None]  # (B, N, 1)
        for layer in self.conv_layers:
            x = layer(x)
            mx.eval(x)  # layer by layer: the long early activations are freed before the next layer runs
        return x  # (B, T, conv_dim[-1])


class FeatureProjection(nn.Module):
    def __init__(self, args: HubertArgs):
        super().__init__()
        self.layer_norm = nn.LayerNorm(args.conv_dim[-1], eps=args.layer_norm_eps)
        self.projection = nn.Linear(args.conv_dim[-1], args.hidden_size)

    def __call__(self, x: mx.array) -> mx.array:
        return self.projection(self.layer_norm(x))


class PositionalConvEmbedding(nn.Module):
    def __init__(self, args: HubertArgs):
        super().__init__()
        k = args.num_conv_pos_embeddings
        self.drop_last = k % 2 == 0
        self.conv = nn.Conv1d(
            args.hidden_size,
            args.hidden_size,
            k,
            padding=k // 2,
            groups=args.num_conv_pos_embedding_groups,
        )

    def __call__(self, x: mx.array) -> mx.array:
        y = self.conv(x)
        if self.drop_last:
            y = y[:, :-1, :]
        return gelu(y)


class Attention(nn.Module):
    def __init__(self, dims: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.scale = (dims // n_heads) ** -0.5
        self.q_proj = nn.Linear(dims, dims)
        self.k_proj = nn.Linear(dims, dims)
        self.v_proj = nn.Linear(dims, dims)
        self.out_proj = nn.Linear(dims, dims)

    def __call__(self, x: mx.array) -> mx.array:
        B, L, D = x.shape
        H = self.n_heads

        def heads(t: mx.array) -> mx.array:
            return t.reshape(B, L, H, D // H).transpose(0, 2, 1, 3)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        o = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale)
        return self.out_proj(o.transpose(0, 2, 1, 3).reshape(B, L, D))


class FeedForward(nn.Module):
    def __init__(self, dims: int, hidden: int):
        super().__init__()
        self.intermediate_dense = nn.Linear(dims, hidden)
        self.output_dense = nn.Linear(hidden, dims)

    def __call__(self, x: mx.array) -> mx.array:
        return self.output_dense(gelu(self.intermediate_dense(x)))


class EncoderLayer(nn.Module):
    def __init__(self, args: HubertArgs):
        super().__init__()
        d, eps = args.hidden_size, args.layer_norm_eps
        self.attention = Attention(d, args.num_attention_heads)
        self.layer_norm = nn.LayerNorm(d, eps=eps)
        self.feed_forward = FeedForward(d, args.intermediate_size)
        self.final_layer_norm = nn.LayerNorm(d, eps=eps)

    def __call__(self, x: mx.array) -> mx.array:
        x = self.layer_norm(x + self.attention(x))
        return self.final_layer_norm(x + self.feed_forward(x))


class Encoder(nn.Module):
    def __init__(self, args: HubertArgs):
        super().__init__()
        self.pos_conv_embed = PositionalConvEmbedding(args)
        self.layer_norm = nn.LayerNorm(args.hidden_size, eps=args.layer_norm_eps)
        self.layers = [EncoderLayer(args) for _ in range(args.num_hidden_layers)]


class HubertModel(nn.Module):
    """The encoder, all float32, channels-last inside:

    * feature extractor: ``len(conv_dim)`` bias-free ``Conv1d`` (kernels ``conv_kernel``, strides
      ``conv_stride``); after conv 0 a GroupNorm with one group per channel (eps 1e-5, the PyTorch default);
      GELU (exact, erf) after every conv. Frames: plain conv arithmetic, T = floor((N - 400) / 320) + 1 for
      the base kernels (:meth:`HubertArgs.num_frames`).
    * feature projection: LayerNorm(conv_dim[-1]) -> Linear(conv_dim[-1] -> hidden).
    * positional conv: grouped Conv1d(hidden, hidden, K, padding K // 2, groups) with the weight norm
      folded in, last frame dropped when K is even, GELU; added to the projected features.
    * encoder: LayerNorm, then post-LN layers ``x = LN(x + Attn(x)); x = LN_final(x + FFN(x))`` with
      FFN = Linear -> GELU -> Linear. LayerNorm eps = ``layer_norm_eps``."""

    def __init__(self, args: HubertArgs):
        super().__init__()
        self.args = args
        self.feature_extractor = FeatureExtractor(args)
        self.feature_projection = FeatureProjection(args)
        self.encoder = Encoder(args)

    def __call__(self, wav: mx.array, output_hidden_states: bool = False) -> mx.array | HubertOutput:
        """``wav`` (B, N) float32 raw 16 kHz samples -> ``last_hidden_state`` (B, T, hidden).

        With ``output_hidden_states=True`` a :class:`HubertOutput` with every intermediate is returned.
        """
        if wav.ndim != 2:
            raise ValueError(f"HuBERT expects a (batch, samples) waveform, got shape {tuple(wav.shape)}")
        if self.args.num_frames(wav.shape[1]) < 1:
            raise ValueError(
                f"waveform too short for HuBERT: {wav.shape[1]} samples, "
                f"need at least {self.args.receptive_field}"
            )
        conv = self.feature_extractor(wav.astype(mx.float32))
        proj = self.feature_projection(conv)
        pos = self.encoder.pos_conv_embed(proj)
        x = self.encoder.layer_norm(proj + pos)
        hidden = [x]
        for layer in self.encoder.layers:
            x = layer(x)
            if output_hidden_states:
                hidden.append(x)
        if not output_hidden_states:
            return x
        return HubertOutput(x, hidden, conv, proj, pos)

    def prepare(self, half: bool = True) -> HubertModel:
        """Ready for inference (the loader calls this): with ``half`` the Linear weights are kept in
        float16 storage, float32 compute (``models/shared/storage.py``). CNHubert runs once per voice, so the
        per-call upcast does not matter and 180 MB are saved."""
        if half:
            half_storage(self)
        return self

    @staticmethod
    def sanitize(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """HF ``HubertModel`` state dict -> MLX names/layouts: what a converted safetensors file holds and what the
        CoreML export reads.

        Names are the Hugging Face names; ``masked_spec_embed`` is dropped, the weight-norm pair is folded, conv
        weights are in MLX layout (out, kernel, in / groups), all float32. C = conv_dim[i], D = hidden_size,
        K = num_conv_pos_embeddings, G = num_conv_pos_embedding_groups, F = intermediate_size, i = conv index,
        l = layer index::

            feature_extractor.conv_layers.i.conv.weight          (C_i, kernel_i, C_{i-1})   C_{-1} = 1
            feature_extractor.conv_layers.0.layer_norm.weight    (C_0,)   GroupNorm scale
            feature_extractor.conv_layers.0.layer_norm.bias      (C_0,)
            feature_projection.layer_norm.weight / .bias         (C_last,)
            feature_projection.projection.weight                 (D, C_last)   Linear (out, in)
            feature_projection.projection.bias                   (D,)
            encoder.pos_conv_embed.conv.weight                   (D, K, D / G) folded g * v / ||v||
            encoder.pos_conv_embed.conv.bias                     (D,)
            encoder.layer_norm.weight / .bias                    (D,)
            encoder.layers.l.attention.{q,k,v,out}_proj.weight   (D, D)        Linear (out, in)
            encoder.layers.l.attention.{q,k,v,out}_proj.bias     (D,)
            encoder.layers.l.layer_norm.weight / .bias           (D,)          after attention
            encoder.layers.l.feed_forward.intermediate_dense.weight / .bias   (F, D) / (F,)
            encoder.layers.l.feed_forward.output_dense.weight / .bias         (D, F) / (D,)
            encoder.layers.l.final_layer_norm.weight / .bias     (D,)          after the FFN"""
        w = {k: v for k, v in weights.items() if not k.endswith("masked_spec_embed")}
        w = {k[len("hubert.") :] if k.startswith("hubert.") else k: v for k, v in w.items()}
        w = to_float32(fold_weight_norm(w))
        out = {}
        for key, value in w.items():
            if key.endswith("conv.weight") and value.ndim == 3:
                value = np.ascontiguousarray(value.transpose(0, 2, 1))  # (out, in, K) -> (out, K, in)
            out[key] = value
        return out


def prompt_features(model: HubertModel, wav16k: np.ndarray) -> mx.array:
    """The SoVITS ``extract_latent`` input for a reference clip: raw mono 16 kHz float waveform ->
    append 9600 zeros (0.6 s, as GPT-SoVITS does) -> HuBERT -> (1, hidden, T) (PyTorch (B, C, T) layout)."""
    wav = np.asarray(wav16k, dtype=np.float32)
    if wav.ndim == 2 and wav.shape[0] == 1:
        wav = wav[0]
    if wav.ndim != 1:
        raise ValueError(f"prompt_features expects a mono 1-D waveform, got shape {wav.shape}")
    wav = np.concatenate([wav, np.zeros(PROMPT_TAIL_SAMPLES, dtype=np.float32)])
    hidden = model(mx.array(wav)[None])
    return hidden.transpose(0, 2, 1)
