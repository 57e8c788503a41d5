"""Speaker-verification model of GPT-SoVITS v2Pro / v2ProPlus voices: ERes2NetV2 (3D-Speaker), inference
only, as upstream ``sv.py SV.compute_embedding3`` runs it (``forward3``: no pooling, no ``seg_1``).

    wav (any rate) --resample_sinc--> 16 kHz --kaldi_fbank--> (T, 80) --ERes2NetV2--> (1, D)

D = 8 * m_channels * expansion * ceil(80 / 8) (20480 for the released model). Activations are NHWC
(B, frequency, time, channels) inside; the original's NCHW (B, C, F, T) is never needed outside.
Every BatchNorm (eval mode, running statistics) is folded into the convolution before it at
``sanitize`` time, so each conv+BN pair is one biased ``Conv2d`` here.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .fbank import SV_SAMPLE_RATE, kaldi_fbank, resample_sinc

BN_EPS = 1e-5
HARDTANH_MAX = 20.0  # the blocks' "ReLU" is Hardtanh(0, 20)
AFF_REDUCTION = 4


@dataclass
class SVArgs:
    m_channels: int = 64
    num_blocks: list[int] = field(default_factory=lambda: [3, 4, 6, 3])
    expansion: int = 4
    scale: int = 4
    widths: list[int] = field(default_factory=lambda: [24, 48, 96, 192])  # floor(planes * baseWidth / 64)
    feat_dim: int = 80
    embedding_size: int = 192  # seg_1's width: unused by forward3, kept for the record

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> SVArgs:
        fields = set(cls.__dataclass_fields__)
        args = cls(**{k: v for k, v in config.items() if k in fields})
        args.validate()
        return args

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SVArgs:
        return cls.from_config(d)

    def validate(self) -> None:
        if len(self.num_blocks) != 4 or len(self.widths) != 4 or min(self.num_blocks) < 1:
            raise ValueError(f"ERes2NetV2 needs 4 stages, got num_blocks={self.num_blocks} widths={self.widths}")
        if self.scale < 2:
            raise ValueError(f"ERes2NetV2 scale {self.scale}: expected at least 2")

    @property
    def output_dim(self) -> int:
        """Width of the embedding: channels x frequency rows of the last stage."""
        rows = self.feat_dim
        for _ in range(3):
            rows = -(-rows // 2)
        return self.m_channels * 8 * self.expansion * rows

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def hardtanh(x: mx.array) -> mx.array:
    return mx.clip(x, 0.0, HARDTANH_MAX)


class AFF(nn.Module):
    """Attentional feature fusion: w = 1 + tanh(conv2(SiLU(conv1([x, y])))); x * w + y * (2 - w)."""

    def __init__(self, channels: int, r: int = AFF_REDUCTION):
        super().__init__()
        inter = channels // r
        self.conv1 = nn.Conv2d(2 * channels, inter, 1)
        self.conv2 = nn.Conv2d(inter, channels, 1)

    def __call__(self, x: mx.array, y: mx.array) -> mx.array:
        a = self.conv2(nn.silu(self.conv1(mx.concatenate([x, y], axis=-1))))
        w = 1.0 + mx.tanh(a)
        return x * w + y * (2.0 - w)


class Block(nn.Module):
    """``BasicBlockERes2NetV2`` (``fuse=False``) or its AFF variant (``fuse=True``)."""

    def __init__(
        self, in_planes: int, planes: int, stride: int, width: int, scale: int, expansion: int, fuse: bool
    ):
        super().__init__()
        self.width = width
        self.conv1 = nn.Conv2d(in_planes, width * scale, 1, stride=stride)
        self.convs = [nn.Conv2d(width, width, 3, padding=1) for _ in range(scale)]
        if fuse:
            self.fuse_models = [AFF(width) for _ in range(scale - 1)]
        self.conv3 = nn.Conv2d(width * scale, planes * expansion, 1)
        if stride != 1 or in_planes != planes * expansion:
            self.shortcut = nn.Conv2d(in_planes, planes * expansion, 1, stride=stride)

    def __call__(self, x: mx.array) -> mx.array:
        out = hardtanh(self.conv1(x))
        w = self.width
        fuse = self.get("fuse_models")
        outs = []
        sp = None
        for i, conv in enumerate(self.convs):
            chunk = out[..., i * w : (i + 1) * w]
            if i == 0:
                sp = chunk
            elif fuse is not None:
                sp = fuse[i - 1](sp, chunk)
            else:
                sp = sp + chunk
            sp = hardtanh(conv(sp))
            outs.append(sp)
        out = self.conv3(mx.concatenate(outs, axis=-1))
        residual = self.shortcut(x) if "shortcut" in self else x
        return hardtanh(out + residual)


class ERes2NetV2(nn.Module):
    def __init__(self, args: SVArgs):
        super().__init__()
        args.validate()
        self.args = args
        m, e = args.m_channels, args.expansion
        self.conv1 = nn.Conv2d(1, m, 3, padding=1)
        in_planes = m
        stages = []
        for s, (n_blocks, width) in enumerate(zip(args.num_blocks, args.widths)):
            planes = m * 2**s
            blocks = []
            for j in range(n_blocks):
                stride = 2 if (s > 0 and j == 0) else 1
                blocks.append(Block(in_planes, planes, stride, width, args.scale, e, fuse=s >= 2))
                in_planes = planes * e
            stages.append(blocks)
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.layer3_ds = nn.Conv2d(m * 4 * e, m * 8 * e, 3, stride=2, padding=1, bias=False)
        self.fuse34 = AFF(m * 8 * e)

    @staticmethod
    def sanitize(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Original state dict -> this module's names: each BatchNorm folded into the conv before it
        (float64 arithmetic, float32 result), conv weights (Co, Ci, kh, kw) -> (Co, kh, kw, Ci), the
        unused pooling/``seg_1`` head and ``num_batches_tracked`` dropped."""
        bn_to_conv = (
            (re.compile(r"^bn1$"), "conv1"),
            (re.compile(r"\.bn1$"), ".conv1"),
            (re.compile(r"\.bns\.(\d+)$"), r".convs.\1"),
            (re.compile(r"\.bn3$"), ".conv3"),
            (re.compile(r"\.shortcut\.1$"), ".shortcut.0"),
            (re.compile(r"\.local_att\.1$"), ".local_att.0"),
            (re.compile(r"\.local_att\.4$"), ".local_att.3"),
        )
        renames = ((".shortcut.0", ".shortcut"), (".local_att.0", ".conv1"), (".local_att.3", ".conv2"))
        if any(k.startswith("fuse34.conv1.") for k in weights):  # already sanitized
            return {k: np.asarray(v, dtype=np.float32) for k, v in weights.items()}
        bns = sorted(k[: -len(".running_mean")] for k in weights if k.endswith(".running_mean"))
        folded: dict[str, np.ndarray] = {}
        used: set[str] = set()
        for bn in bns:
            conv = None
            for pattern, repl in bn_to_conv:
                if pattern.search(bn):
                    conv = pattern.sub(repl, bn)
                    break
            if conv is None or f"{conv}.weight" not in weights:
                raise ValueError(f"BatchNorm {bn!r} follows no known convolution")
            gamma = weights[f"{bn}.weight"].astype(np.float64)
            beta = weights[f"{bn}.bias"].astype(np.float64)
            mean = weights[f"{bn}.running_mean"].astype(np.float64)
            var = weights[f"{bn}.running_var"].astype(np.float64)
            k = gamma / np.sqrt(var + BN_EPS)
            w = weights[f"{conv}.weight"].astype(np.float64)
            b = weights[f"{conv}.bias"].astype(np.float64) if f"{conv}.bias" in weights else 0.0
            folded[f"{conv}.weight"] = w * k[:, None, None, None]
            folded[f"{conv}.bias"] = (b - mean) * k + beta
            used |= {f"{bn}.{n}" for n in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")}
            used |= {f"{conv}.weight", f"{conv}.bias"}
        for key, value in weights.items():
            if key in used or key.endswith("num_batches_tracked") or key.startswith(("seg_", "pool.")):
                continue
            folded[key] = value.astype(np.float64)
        out = {}
        for key, value in folded.items():
            new = key
            for old, rep in renames:
                new = new.replace(old, rep)
            if value.ndim == 4:
                value = value.transpose(0, 2, 3, 1)
            out[new] = np.ascontiguousarray(value, dtype=np.float32)
        return out

    def stages(self, fbank) -> dict[str, mx.array]:
        """Every stage of ``forward3`` for fbank (B, T, feat_dim), NHWC: ``stem``, ``layer1``..``layer4``,
        ``layer3_ds``, ``fuse34`` (B, F, T', C) and ``embedding`` (B, D)."""
        x = mx.array(np.asarray(fbank, dtype=np.float32)) if not isinstance(fbank, mx.array) else fbank
        if x.ndim == 2:
            x = x[None]
        x = x.transpose(0, 2, 1)[..., None]  # (B, F, T, 1): frequency = height, time = width
        out: dict[str, mx.array] = {}
        stem = self.conv1(x)
        out["stem"] = stem
        h = nn.relu(stem)
        for name in ("layer1", "layer2", "layer3", "layer4"):
            for block in getattr(self, name):
                h = block(h)
            out[name] = h
        out["layer3_ds"] = self.layer3_ds(out["layer3"])
        fused = self.fuse34(out["layer4"], out["layer3_ds"])
        out["fuse34"] = fused
        b, f, _, c = fused.shape
        out["embedding"] = mx.mean(fused, axis=2).transpose(0, 2, 1).reshape(b, c * f)
        return out

    def __call__(self, fbank) -> mx.array:
        """fbank (B, T, feat_dim) -> speaker embedding (B, D) (``forward3``)."""
        return self.stages(fbank)["embedding"]

    @property
    def output_dim(self) -> int:
        return self.args.output_dim


def sv_fbank(wav: np.ndarray, sr: int) -> np.ndarray:
    """The sv model's input features of a mono waveform at ``sr``: resampled to 16 kHz as upstream does
    (torchaudio's sinc resampler), then Kaldi fbank: (T, 80) float32."""
    wav16k = resample_sinc(np.asarray(wav, dtype=np.float32), int(sr), SV_SAMPLE_RATE)
    return kaldi_fbank(wav16k, num_mel_bins=80, sample_frequency=SV_SAMPLE_RATE)


def speaker_embedding(model: ERes2NetV2, wav: np.ndarray, sr: int) -> mx.array:
    """The v2Pro speaker embedding (1, D) of a reference waveform at ``sr`` (upstream: the 32 kHz
    reference after ``_get_ref_spec``'s peak normalisation, resampled to 16 kHz, ``compute_embedding3``)."""
    emb = model(sv_fbank(wav, sr)[None])
    mx.eval(emb)
    return emb
