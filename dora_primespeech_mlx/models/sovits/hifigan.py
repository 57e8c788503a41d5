"""HiFi-GAN generator of the SoVITS synthesizer (docs/model.md, "The HiFi-GAN decoder"). Activations (B, T, C)."""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn

from .conv import Conv1d, ConvTranspose1d

LRELU_SLOPE = 0.1


def leaky_relu(x: mx.array, slope: float) -> mx.array:
    return mx.maximum(x, x * slope)


class ResBlock1(nn.Module):
    """3 x [lrelu(0.1) -> dilated conv -> lrelu(0.1) -> conv -> + residual], "same" padding."""

    def __init__(self, channels: int, kernel_size: int, dilations: list[int] | tuple[int, ...]):
        super().__init__()
        self.convs1 = [
            Conv1d(channels, channels, kernel_size, padding=d * (kernel_size - 1) // 2, dilation=d) for d in dilations
        ]
        self.convs2 = [Conv1d(channels, channels, kernel_size, padding=(kernel_size - 1) // 2) for _ in dilations]
        self.reach = sum((kernel_size - 1) // 2 * (d + 1) for d in dilations)  # samples each side

    def __call__(self, x: mx.array) -> mx.array:
        for c1, c2 in zip(self.convs1, self.convs2):
            x = x + c2(leaky_relu(c1(leaky_relu(x, LRELU_SLOPE)), LRELU_SLOPE))
        return x


class Generator(nn.Module):
    """conv_pre + cond(g) -> stages of [lrelu(0.1), ConvTranspose, mean of ResBlock1s] -> lrelu(0.01)
    -> conv_post (no bias) -> tanh."""

    def __init__(
        self,
        in_channels: int,
        resblock_kernel_sizes: list[int],
        resblock_dilation_sizes: list[list[int]],
        upsample_rates: list[int],
        upsample_initial_channel: int,
        upsample_kernel_sizes: list[int],
        gin_channels: int,
    ):
        super().__init__()
        self.num_kernels = len(resblock_kernel_sizes)
        self.conv_pre = Conv1d(in_channels, upsample_initial_channel, 7, padding=3)
        self.cond = Conv1d(gin_channels, upsample_initial_channel, 1)
        self.ups = []
        self.resblocks = []
        ch = upsample_initial_channel
        for i, (u, k) in enumerate(zip(upsample_rates, upsample_kernel_sizes)):
            c_in, ch = upsample_initial_channel // (2**i), upsample_initial_channel // (2 ** (i + 1))
            self.ups.append(ConvTranspose1d(c_in, ch, k, u, padding=(k - u) // 2))
            for kr, dil in zip(resblock_kernel_sizes, resblock_dilation_sizes):
                self.resblocks.append(ResBlock1(ch, kr, dil))
        self.conv_post = Conv1d(ch, 1, 7, padding=3, bias=False)
        self._receptive_frames = self._reach(7, 7)

    @property
    def hop_length(self) -> int:
        hop = 1
        for up in self.ups:
            hop *= up.stride
        return hop

    @property
    def receptive_frames(self) -> int:
        """How many input frames on each side can change an output sample (rounded up, conservative): a
        crop of the input with this many extra frames on each side gives the same samples in its interior
        (every layer is a convolution: conv_pre, per stage a transposed conv and the resblocks, conv_post).
        From the layer shapes at construction (the weights may be dropped while ONNX Runtime serves)."""
        return self._receptive_frames

    def _reach(self, pre_kernel: int, post_kernel: int) -> int:
        reach = (pre_kernel - 1) / 2
        rate, n = 1, self.num_kernels
        for i, up in enumerate(self.ups):
            reach += math.ceil((up.kernel_size - 1) / up.stride) / rate
            rate *= up.stride
            reach += max(block.reach for block in self.resblocks[i * n : (i + 1) * n]) / rate
        reach += (post_kernel - 1) / 2 / rate
        return math.ceil(reach)

    def prepare(self) -> None:
        for up in self.ups:
            up.prepare()

    def __call__(self, x: mx.array, g: mx.array) -> mx.array:
        """x (B, T, in_channels), g (B, 1, gin) -> audio (B, T * hop, 1)."""
        x = self.conv_pre(x) + self.cond(g)
        n = self.num_kernels
        for i, up in enumerate(self.ups):
            x = up(leaky_relu(x, LRELU_SLOPE))
            xs = self.resblocks[i * n](x)
            for j in range(1, n):
                xs = xs + self.resblocks[i * n + j](x)
            x = xs / n
        x = self.conv_post(leaky_relu(x, 0.01))
        return mx.tanh(x)
