"""1-D convolutions for the SoVITS synthesizer, with GEMM formulations for the MLX CPU backend.

MLX on CPU runs ``conv1d`` with ``dilation > 1`` and every ``conv_transpose1d`` through a naive loop
(``slow_conv_1D``), far slower than a matrix product (docs/performance.md,
"The SoVITS vocoder on ONNX Runtime"). :func:`conv1d_gemm` (pad, stack the K dilated, strided shifted slices on
the channel axis, one matmul) and :func:`conv_transpose1d_gemm` (``x @ W[Ci, K*Co]``, then an overlap-add of
``ceil(K/s)`` shifted blocks) express them as one GEMM each.

:func:`use_gemm` decides the path: ``"auto"`` (the default) takes the GEMM path when the default device is the
CPU and the native MLX ops elsewhere (Metal/CUDA, where they are fast). Each convolution module carries its form
(``impl``: ``auto`` | ``gemm`` | ``native``); :func:`set_impl` gives every convolution of a model one form (the
loader passes the runtime's ``conv_impl``). Layout: activations (B, L, C), weights MLX's (C_out, K, C_in)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

IMPLS = ("auto", "gemm", "native")


def check_impl(name: str) -> str:
    """``name`` (``auto``, ``gemm`` or ``native``) normalised; ValueError otherwise."""
    impl = name.strip().lower()
    if impl not in IMPLS:
        raise ValueError(f"unknown conv implementation {name!r}: expected one of {', '.join(IMPLS)}")
    return impl


def set_impl(model: nn.Module, name: str) -> str:
    """Give every convolution of ``model`` the form ``name`` (``auto``, ``gemm`` or ``native``); returns it."""
    impl = check_impl(name)
    for _, module in model.named_modules():
        if isinstance(module, (Conv1d, ConvTranspose1d)):
            module.impl = impl
    return impl


def use_gemm(impl: str = "auto") -> bool:
    """True when the GEMM formulations should be used (always for ``gemm``, on the CPU for ``auto``)."""
    if impl == "auto":
        return mx.default_device().type == mx.cpu
    return impl == "gemm"


def _pads(padding: int | tuple[int, int]) -> tuple[int, int]:
    if isinstance(padding, int):
        return padding, padding
    left, right = padding
    return int(left), int(right)


def _pad_time(x: mx.array, left: int, right: int) -> mx.array:
    if left == 0 and right == 0:
        return x
    return mx.pad(x, [(0, 0), (left, right), (0, 0)])


# ---------------------------------------------------------------------------------------------------------
# conv1d


def conv1d_gemm(
    x: mx.array,
    weight: mx.array,
    bias: mx.array | None = None,
    stride: int = 1,
    padding: int | tuple[int, int] = 0,
    dilation: int = 1,
) -> mx.array:
    """``conv1d`` as one matmul. x (B, L, Ci), weight (Co, K, Ci) -> (B, L_out, Co)."""
    c_out, k, c_in = weight.shape
    left, right = _pads(padding)
    x = _pad_time(x, left, right)
    length = x.shape[1]
    span = dilation * (k - 1) + 1
    n_out = (length - span) // stride + 1
    if n_out <= 0:
        raise ValueError(f"conv1d: input of length {length} is shorter than the kernel span {span}")
    w = weight.reshape(c_out, k * c_in)  # column index j * Ci + c, matching the stacked taps below
    if k == 1:
        cols = x[:, : (n_out - 1) * stride + 1 : stride] if stride > 1 else x
    else:
        # im2col in one copy: a (B, n_out, K, Ci) strided view of the padded input (as_strided reads the
        # row-major data of x, copying it first if x is not contiguous), flattened to (B, n_out, K*Ci).
        batch = x.shape[0]
        view = mx.as_strided(x, (batch, n_out, k, c_in), (length * c_in, stride * c_in, dilation * c_in, 1))
        cols = view.reshape(batch, n_out, k * c_in)
    y = cols @ w.T
    return y + bias if bias is not None else y


def conv1d_native(
    x: mx.array,
    weight: mx.array,
    bias: mx.array | None = None,
    stride: int = 1,
    padding: int | tuple[int, int] = 0,
    dilation: int = 1,
) -> mx.array:
    """``mx.conv1d`` with torch-style (possibly asymmetric) padding."""
    left, right = _pads(padding)
    if left == right:
        y = mx.conv1d(x, weight, stride=stride, padding=left, dilation=dilation)
    else:
        y = mx.conv1d(_pad_time(x, left, right), weight, stride=stride, padding=0, dilation=dilation)
    return y + bias if bias is not None else y


def conv1d(
    x: mx.array,
    weight: mx.array,
    bias: mx.array | None = None,
    stride: int = 1,
    padding: int | tuple[int, int] = 0,
    dilation: int = 1,
    impl: str = "auto",
) -> mx.array:
    """Dispatch: a plain matmul for 1x1 kernels, GEMM or native MLX otherwise (see :func:`use_gemm`)."""
    if weight.shape[1] == 1 and stride == 1 and _pads(padding) == (0, 0):
        y = x @ weight.reshape(weight.shape[0], -1).T
        return y + bias if bias is not None else y
    fn = conv1d_gemm if use_gemm(impl) else conv1d_native
    return fn(x, weight, bias, stride=stride, padding=padding, dilation=dilation)


# ---------------------------------------------------------------------------------------------------------
# conv_transpose1d


def transpose_gemm_weight(weight: mx.array, stride: int) -> mx.array:
    """MLX transposed-conv weight (Co, K, Ci) -> GEMM weight (Ci, G*s*Co), taps zero-padded to G*s,
    G = ceil(K / s); column index (tap, out channel)."""
    c_out, k, c_in = weight.shape
    groups = -(-k // stride)
    w = mx.transpose(weight, (2, 1, 0))  # (Ci, K, Co)
    if groups * stride > k:
        w = mx.pad(w, [(0, 0), (0, groups * stride - k), (0, 0)])
    return w.reshape(c_in, groups * stride * c_out)


def conv_transpose1d_gemm(
    x: mx.array,
    gemm_weight: mx.array,
    bias: mx.array | None,
    kernel_size: int,
    stride: int,
    padding: int = 0,
) -> mx.array:
    """``conv_transpose1d`` (torch semantics, output length (L-1)*s - 2p + K) as one matmul plus an
    overlap-add. ``gemm_weight`` comes from :func:`transpose_gemm_weight`. x (B, L, Ci) -> (B, L_out, Co)."""
    b, length, _ = x.shape
    groups = -(-kernel_size // stride)
    c_out = gemm_weight.shape[1] // (groups * stride)
    y = x @ gemm_weight  # (B, L, G*s*Co): input frame t writes taps t*s + [0, G*s)
    width = stride * c_out
    if groups == 1:
        full = y
    else:
        parts = []
        for g in range(groups):
            part = y[:, :, g * width : (g + 1) * width]
            parts.append(mx.pad(part, [(0, 0), (g, groups - 1 - g), (0, 0)]))
        full = parts[0]
        for part in parts[1:]:
            full = full + part
    full = full.reshape(b, (length + groups - 1) * stride, c_out)
    n_out = (length - 1) * stride + kernel_size - 2 * padding
    out = full[:, padding : padding + n_out]
    return out + bias if bias is not None else out


def conv_transpose1d_native(
    x: mx.array, weight: mx.array, bias: mx.array | None, stride: int, padding: int = 0
) -> mx.array:
    y = mx.conv_transpose1d(x, weight, stride=stride, padding=padding)
    return y + bias if bias is not None else y


# ---------------------------------------------------------------------------------------------------------
# modules


class _WeightCache:
    """A derived weight kept outside the module's parameter tree (a plain object, not an array)."""

    def __init__(self):
        self.source: mx.array | None = None
        self.value: mx.array | None = None


class Conv1d(nn.Module):
    """Conv1d with MLX weight layout (Co, K, Ci) and torch-style padding (int or (left, right))."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        padding: int | tuple[int, int] = 0,
        dilation: int = 1,
        bias: bool = True,
    ):
        super().__init__()
        self.stride = stride
        self.padding = _pads(padding)
        self.dilation = dilation
        self.impl = "auto"  # auto | gemm | native (set_impl)
        self.weight = mx.zeros((out_channels, kernel_size, in_channels))
        if bias:
            self.bias = mx.zeros((out_channels,))

    def __call__(self, x: mx.array) -> mx.array:
        bias = self.bias if "bias" in self else None
        return conv1d(x, self.weight, bias, self.stride, self.padding, self.dilation, self.impl)


class ConvTranspose1d(nn.Module):
    """ConvTranspose1d (torch semantics) with MLX weight layout (Co, K, Ci).

    On the GEMM path the reshaped weight is computed once and cached (outside the parameters, so
    ``load_weights``/``save`` are unaffected); the cache follows the identity of ``weight``, so loading
    new weights refreshes it. Call :meth:`prepare` to build it ahead of the first call.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int, padding: int = 0):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = padding
        self.impl = "auto"  # auto | gemm | native (set_impl)
        self.weight = mx.zeros((out_channels, kernel_size, in_channels))
        self.bias = mx.zeros((out_channels,))
        self._cache = _WeightCache()

    def gemm_weight(self) -> mx.array:
        cache = self._cache
        if cache.source is not self.weight:
            cache.value = transpose_gemm_weight(self.weight, self.stride)
            mx.eval(cache.value)
            cache.source = self.weight
        return cache.value

    def prepare(self) -> None:
        if use_gemm(self.impl):
            self.gemm_weight()

    def __call__(self, x: mx.array) -> mx.array:
        if use_gemm(self.impl):
            return conv_transpose1d_gemm(x, self.gemm_weight(), self.bias, self.kernel_size, self.stride, self.padding)
        return conv_transpose1d_native(x, self.weight, self.bias, self.stride, self.padding)
