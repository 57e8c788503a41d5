"""Building blocks of the SoVITS synthesizer (docs/model.md, "SoVITS: tokens to audio").

All activations are (B, T, C) inside this module. Batch elements must share one length: the inference
path of the original never pads (``decode`` builds full-length masks), so the masks are all ones and
are left out here.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn

from .conv import Conv1d


class ChannelLayerNorm(nn.Module):
    """VITS ``LayerNorm`` over the channel axis, parameters ``gamma``/``beta`` (eps 1e-5)."""

    def __init__(self, channels: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.gamma = mx.ones((channels,))
        self.beta = mx.zeros((channels,))

    def __call__(self, x: mx.array) -> mx.array:
        return mx.fast.layer_norm(x, self.gamma, self.beta, self.eps)


def _split_heads(x: mx.array, n_heads: int) -> mx.array:
    b, t, c = x.shape
    return x.reshape(b, t, n_heads, c // n_heads).transpose(0, 2, 1, 3)  # (B, H, T, d)


def _merge_heads(x: mx.array) -> mx.array:
    b, h, t, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, t, h * d)


class RelativeMultiHeadAttention(nn.Module):
    """VITS ``attentions.MultiHeadAttention`` (1x1 convs q/k/v/o, softmax scale 1/sqrt(head_dim)).

    With ``window_size`` set (self-attention only) it adds the relative-position terms: embeddings
    ``emb_rel_k`` / ``emb_rel_v`` of shape (1, 2w+1, head_dim) shared by all heads, for offsets j - i in
    [-w, w] (offsets outside the window contribute nothing).
    """

    def __init__(self, channels: int, out_channels: int, n_heads: int, window_size: int | None = None):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = channels // n_heads
        self.window_size = window_size
        self.conv_q = Conv1d(channels, channels, 1)
        self.conv_k = Conv1d(channels, channels, 1)
        self.conv_v = Conv1d(channels, channels, 1)
        self.conv_o = Conv1d(channels, out_channels, 1)
        if window_size is not None:
            self.emb_rel_k = mx.zeros((1, 2 * window_size + 1, self.head_dim))
            self.emb_rel_v = mx.zeros((1, 2 * window_size + 1, self.head_dim))

    def _relative_index(self, length: int) -> tuple[mx.array, mx.array, mx.array]:
        w = self.window_size
        pos = mx.arange(length)
        offset = pos[None, :] - pos[:, None]  # j - i
        key_idx = mx.clip(offset + w, 0, 2 * w)
        in_window = (mx.abs(offset) <= w).astype(mx.float32)
        value_idx = pos[:, None] + mx.arange(2 * w + 1)[None, :]  # column of p padded by w each side
        return key_idx, in_window, value_idx

    def __call__(self, x: mx.array, context: mx.array) -> mx.array:
        q = _split_heads(self.conv_q(x), self.n_heads) * (1.0 / math.sqrt(self.head_dim))
        k = _split_heads(self.conv_k(context), self.n_heads)
        v = _split_heads(self.conv_v(context), self.n_heads)
        scores = q @ k.transpose(0, 1, 3, 2)  # (B, H, Tq, Tk)
        if self.window_size is not None:
            length = x.shape[1]
            if context.shape[1] != length:
                raise ValueError("relative attention is only available for self-attention")
            key_idx, in_window, value_idx = self._relative_index(length)
            rel_logits = q @ self.emb_rel_k[0].T  # (B, H, T, 2w+1)
            local = mx.take_along_axis(rel_logits, mx.broadcast_to(key_idx, scores.shape), axis=-1)
            scores = scores + local * in_window
        p = mx.softmax(scores, axis=-1, precise=True)
        out = p @ v
        if self.window_size is not None:
            w = self.window_size
            p_pad = mx.pad(p, [(0, 0), (0, 0), (0, 0), (w, w)])
            b, h, t, _ = p.shape
            rel_w = mx.take_along_axis(p_pad, mx.broadcast_to(value_idx, (b, h, t, 2 * w + 1)), axis=-1)
            out = out + rel_w @ self.emb_rel_v[0]
        return self.conv_o(_merge_heads(out))


class FFN(nn.Module):
    """conv(k) -> ReLU -> conv(k) with "same" padding ((k-1)//2 left, k//2 right)."""

    def __init__(self, channels: int, filter_channels: int, kernel_size: int):
        super().__init__()
        pad = ((kernel_size - 1) // 2, kernel_size // 2)
        self.conv_1 = Conv1d(channels, filter_channels, kernel_size, padding=pad)
        self.conv_2 = Conv1d(filter_channels, channels, kernel_size, padding=pad)

    def __call__(self, x: mx.array) -> mx.array:
        return self.conv_2(nn.relu(self.conv_1(x)))


class Encoder(nn.Module):
    """VITS ``attentions.Encoder``: post-LN layers of relative self-attention and a conv FFN."""

    def __init__(
        self,
        hidden_channels: int,
        filter_channels: int,
        n_heads: int,
        n_layers: int,
        kernel_size: int,
        window_size: int = 4,
    ):
        super().__init__()
        self.attn_layers = [
            RelativeMultiHeadAttention(hidden_channels, hidden_channels, n_heads, window_size) for _ in range(n_layers)
        ]
        self.norm_layers_1 = [ChannelLayerNorm(hidden_channels) for _ in range(n_layers)]
        self.ffn_layers = [FFN(hidden_channels, filter_channels, kernel_size) for _ in range(n_layers)]
        self.norm_layers_2 = [ChannelLayerNorm(hidden_channels) for _ in range(n_layers)]

    def __call__(self, x: mx.array) -> mx.array:
        for attn, norm1, ffn, norm2 in zip(self.attn_layers, self.norm_layers_1, self.ffn_layers, self.norm_layers_2):
            x = norm1(x + attn(x, x))
            x = norm2(x + ffn(x))
        return x


class MRTE(nn.Module):
    """Multi-reference timbre encoder: text cross-attention into the SSL stream plus ``ge``."""

    def __init__(self, content_channels: int = 192, hidden_size: int = 512, n_heads: int = 4):
        super().__init__()
        self.cross_attention = RelativeMultiHeadAttention(hidden_size, hidden_size, n_heads)
        self.c_pre = Conv1d(content_channels, hidden_size, 1)
        self.text_pre = Conv1d(content_channels, hidden_size, 1)
        self.c_post = Conv1d(hidden_size, content_channels, 1)

    def __call__(self, ssl: mx.array, text: mx.array, ge: mx.array) -> mx.array:
        """ssl (B, Ty, 192), text (B, Tt, 192), ge (B, 1, 512) -> (B, Ty, 192)."""
        c = self.c_pre(ssl)
        t = self.text_pre(text)
        return self.c_post(self.cross_attention(c, t) + c + ge)


# ---------------------------------------------------------------------------------------------------------
# reference encoder


def mish(x: mx.array) -> mx.array:
    return x * mx.tanh(mx.logaddexp(x, 0.0))


class Conv1dGLU(nn.Module):
    """Conv1d(C -> 2C, k, "same") -> value * sigmoid(gate) -> + residual."""

    def __init__(self, channels: int, kernel_size: int):
        super().__init__()
        self.conv = Conv1d(channels, 2 * channels, kernel_size, padding=(kernel_size - 1) // 2)

    def __call__(self, x: mx.array) -> mx.array:
        value, gate = mx.split(self.conv(x), 2, axis=-1)
        return x + value * mx.sigmoid(gate)


class StyleAttention(nn.Module):
    """MelStyleEncoder self-attention: scores divided by sqrt(d_model) (not the head width), residual."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.scale = 1.0 / math.sqrt(d_model)
        self.w_qs = nn.Linear(d_model, d_model)
        self.w_ks = nn.Linear(d_model, d_model)
        self.w_vs = nn.Linear(d_model, d_model)
        self.fc = nn.Linear(d_model, d_model)

    def __call__(self, x: mx.array) -> mx.array:
        q = _split_heads(self.w_qs(x), self.n_heads)
        k = _split_heads(self.w_ks(x), self.n_heads)
        v = _split_heads(self.w_vs(x), self.n_heads)
        p = mx.softmax((q @ k.transpose(0, 1, 3, 2)) * self.scale, axis=-1, precise=True)
        return self.fc(_merge_heads(p @ v)) + x


class MelStyleEncoder(nn.Module):
    """Reference (timbre) encoder: spectrogram frames (B, F, n_bins) -> style vector (B, out_dim)."""

    def __init__(self, in_dim: int, out_dim: int, hidden: int = 128, kernel_size: int = 5, n_heads: int = 2):
        super().__init__()
        self.spectral_in = nn.Linear(in_dim, hidden)
        self.spectral_out = nn.Linear(hidden, hidden)
        self.temporal = [Conv1dGLU(hidden, kernel_size) for _ in range(2)]
        self.slf_attn = StyleAttention(hidden, n_heads)
        self.fc = nn.Linear(hidden, out_dim)

    def __call__(self, x: mx.array) -> mx.array:
        x = mish(self.spectral_out(mish(self.spectral_in(x))))
        for layer in self.temporal:
            x = layer(x)
        x = self.fc(self.slf_attn(x))
        return mx.mean(x, axis=1)


# ---------------------------------------------------------------------------------------------------------
# flow


class WN(nn.Module):
    """WaveNet-style gated residual stack conditioned on ``g`` (non-causal, "same" padding)."""

    def __init__(self, hidden: int, kernel_size: int, dilation_rate: int, n_layers: int, gin_channels: int):
        super().__init__()
        self.hidden = hidden
        self.cond_layer = Conv1d(gin_channels, 2 * hidden * n_layers, 1)
        self.in_layers = []
        self.res_skip_layers = []
        for i in range(n_layers):
            dilation = dilation_rate**i
            pad = (kernel_size * dilation - dilation) // 2
            self.in_layers.append(Conv1d(hidden, 2 * hidden, kernel_size, padding=pad, dilation=dilation))
            out = 2 * hidden if i < n_layers - 1 else hidden
            self.res_skip_layers.append(Conv1d(hidden, out, 1))

    def __call__(self, x: mx.array, g: mx.array) -> mx.array:
        """x (B, T, hidden), g (B, 1, gin) -> (B, T, hidden)."""
        h = self.hidden
        cond = self.cond_layer(g)
        output = None
        n = len(self.in_layers)
        for i, (in_layer, res_skip) in enumerate(zip(self.in_layers, self.res_skip_layers)):
            a = in_layer(x) + cond[..., 2 * h * i : 2 * h * (i + 1)]
            acts = mx.tanh(a[..., :h]) * mx.sigmoid(a[..., h:])
            rs = res_skip(acts)
            if i < n - 1:
                x = x + rs[..., :h]
                skip = rs[..., h:]
            else:
                skip = rs
            output = skip if output is None else output + skip
        return output


class ResidualCouplingLayer(nn.Module):
    """Mean-only affine coupling: x1 <- x1 -/+ post(WN(pre(x0), g))."""

    def __init__(self, channels: int, hidden: int, kernel_size: int, dilation_rate: int, n_layers: int, gin: int):
        super().__init__()
        self.half = channels // 2
        self.pre = Conv1d(self.half, hidden, 1)
        self.enc = WN(hidden, kernel_size, dilation_rate, n_layers, gin)
        self.post = Conv1d(hidden, self.half, 1)

    def __call__(self, x: mx.array, g: mx.array, reverse: bool = True) -> mx.array:
        x0, x1 = x[..., : self.half], x[..., self.half :]
        m = self.post(self.enc(self.pre(x0), g))
        x1 = x1 - m if reverse else x1 + m
        return mx.concatenate([x0, x1], axis=-1)


class ResidualCouplingBlock(nn.Module):
    """``n_flows`` couplings, each followed by a channel flip; inference runs it in reverse."""

    def __init__(
        self,
        channels: int,
        hidden: int,
        kernel_size: int,
        dilation_rate: int,
        n_layers: int,
        gin: int,
        n_flows: int = 4,
    ):
        super().__init__()
        self.couplings = [
            ResidualCouplingLayer(channels, hidden, kernel_size, dilation_rate, n_layers, gin) for _ in range(n_flows)
        ]

    def __call__(self, x: mx.array, g: mx.array, reverse: bool = True) -> mx.array:
        if reverse:
            for coupling in reversed(self.couplings):
                x = coupling(x[..., ::-1], g, reverse=True)
            return x
        for coupling in self.couplings:
            x = coupling(x, g, reverse=False)[..., ::-1]
        return x
