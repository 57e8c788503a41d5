"""A numpy interpreter for MIL programs, to check exported CoreML programs where CoreML cannot run
(Linux; docs/coreml.md, "Checking a program on Linux").

It walks a function's operations in order, binds concrete numpy values to each op's input variables
(making their types concrete too, since several value inferences read the static shape, which is
symbolic for EnumeratedShapes inputs) and calls the op's own ``value_inference()`` (coremltools
implements it with numpy for most ops, so the checked semantics are coremltools' own); numpy kernels
(:data:`KERNELS`, see :func:`run_program`) stand in where that is missing or too slow. Values keep the program's
dtypes: an fp16 program computes with numpy float16 values. This checks graph semantics, not ANE bit-exactness."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


class _Bound:
    """Stand-in for a builtin-type value: ``Var.val`` / ``Var.sym_val`` read ``.val``."""

    __slots__ = ("val",)

    def __init__(self, val):
        self.val = val


def _conv(op, value: Callable[[Any], Any]) -> np.ndarray:
    """MIL ``conv`` (1-D or 2-D, strides, dilations, groups, valid/same/custom padding) with numpy."""
    x = np.asarray(value(op.x))
    w = np.asarray(value(op.weight))
    b = None if op.bias is None else np.asarray(value(op.bias))
    nd = x.ndim - 2
    if nd not in (1, 2):
        raise NotImplementedError(f"conv with {nd} spatial dims")
    strides = list(value(op.strides)) if op.strides is not None else [1] * nd
    dil = list(value(op.dilations)) if op.dilations is not None else [1] * nd
    groups = int(value(op.groups)) if op.groups is not None else 1
    pad_type = value(op.pad_type) if op.pad_type is not None else "valid"
    if nd == 1:  # as 2-D with a unit height
        x, w = x[:, :, None, :], w[:, :, None, :]
        strides, dil = [1, *strides], [1, *dil]
    pad = [0, 0, 0, 0]
    if pad_type == "custom":
        p = list(value(op.pad))
        pad = [0, 0, *p] if nd == 1 else p
    elif pad_type in ("same", "same_lower"):
        for i in range(2):
            size, k = x.shape[2 + i], (w.shape[2 + i] - 1) * dil[i] + 1
            out = -(-size // strides[i])
            total = max((out - 1) * strides[i] + k - size, 0)
            lo = total // 2 if pad_type == "same" else total - total // 2
            pad[2 * i], pad[2 * i + 1] = lo, total - lo
    elif pad_type != "valid":
        raise NotImplementedError(f"conv pad_type {pad_type!r}")
    dtype = x.dtype
    xf = np.pad(x.astype(np.float32), ((0, 0), (0, 0), (pad[0], pad[1]), (pad[2], pad[3])))
    wf = w.astype(np.float32)
    B, C, H, W = xf.shape
    O, Cg, KH, KW = wf.shape
    if C != Cg * groups or O % groups:
        raise ValueError(f"conv {op.name}: input channels {C} vs weight {w.shape} with groups={groups}")
    oh = (H - (KH - 1) * dil[0] - 1) // strides[0] + 1
    ow = (W - (KW - 1) * dil[1] - 1) // strides[1] + 1
    # patches (B, C, KH, KW, oh, ow) via strided views
    sb, sc, sh, sw = xf.strides
    patches = np.lib.stride_tricks.as_strided(
        xf,
        shape=(B, C, KH, KW, oh, ow),
        strides=(sb, sc, sh * dil[0], sw * dil[1], sh * strides[0], sw * strides[1]),
        writeable=False,
    )
    og = O // groups
    out = np.empty((B, O, oh, ow), dtype=np.float32)
    for g in range(groups):
        pg = patches[:, g * Cg : (g + 1) * Cg].reshape(B, Cg * KH * KW, oh * ow)
        wg = wf[g * og : (g + 1) * og].reshape(og, Cg * KH * KW)
        out[:, g * og : (g + 1) * og] = np.einsum("ok,bkn->bon", wg, pg, optimize=True).reshape(B, og, oh, ow)
    if b is not None:
        out += b.astype(np.float32)[None, :, None, None]
    if nd == 1:
        out = out[:, :, 0, :]
    return out.astype(dtype)


def _shape(op, value: Callable[[Any], Any]) -> np.ndarray:
    """``shape`` (its value inference returns the static, possibly symbolic, type shape)."""
    return np.array(np.shape(value(op.x)), dtype=np.int32)


def _batch_norm(op, value: Callable[[Any], Any]) -> np.ndarray:
    """``batch_norm`` over axis 1 (the graph passes fuse a per-channel scale + shift into it)."""
    x = np.asarray(value(op.x))
    shape = (1, -1) + (1,) * (x.ndim - 2)

    def per_channel(v, default):
        return np.float32(default) if v is None else np.asarray(value(v), dtype=np.float32).reshape(shape)

    mean, var = per_channel(op.mean, 0.0), per_channel(op.variance, 1.0)
    gamma, beta = per_channel(op.gamma, 1.0), per_channel(op.beta, 0.0)
    eps = np.float32(value(op.epsilon)) if op.epsilon is not None else np.float32(1e-5)
    y = (x.astype(np.float32) - mean) / np.sqrt(var + eps) * gamma + beta
    return y.astype(x.dtype)


def _erf(x: np.ndarray) -> np.ndarray:
    """erf in float64 (Abramowitz & Stegun 7.1.26, |error| <= 1.5e-7)."""
    x = np.asarray(x, dtype=np.float64)
    s, a = np.sign(x), np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return s * (1.0 - poly * np.exp(-a * a))


def _gelu(op, value: Callable[[Any], Any]) -> np.ndarray:
    """``gelu`` (coremltools' value inference calls math.erf per element: far too slow here)."""
    x = np.asarray(value(op.x))
    mode = value(op.mode) if op.mode is not None else "EXACT"
    xf = x.astype(np.float64)
    if mode == "EXACT":
        y = 0.5 * xf * (1.0 + _erf(xf / np.sqrt(2.0)))
    elif mode == "TANH_APPROXIMATION":
        y = 0.5 * xf * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (xf + 0.044715 * xf**3)))
    elif mode == "SIGMOID_APPROXIMATION":
        y = xf / (1.0 + np.exp(-1.702 * xf))
    else:
        raise NotImplementedError(f"gelu mode {mode!r}")
    return y.astype(x.dtype)


def _matmul(op, value: Callable[[Any], Any]) -> np.ndarray:
    """``matmul`` with float32 accumulation (numpy's fp16 matmul has no BLAS and is very slow)."""
    x, y = np.asarray(value(op.x)), np.asarray(value(op.y))
    dtype = np.result_type(x, y)
    if op.transpose_x is not None and value(op.transpose_x):
        x = np.swapaxes(x, -1, -2)
    if op.transpose_y is not None and value(op.transpose_y):
        y = np.swapaxes(y, -1, -2)
    compute = np.float32 if np.issubdtype(dtype, np.floating) else dtype
    out = np.matmul(np.ascontiguousarray(x, dtype=compute), np.ascontiguousarray(y, dtype=compute))
    return out.astype(dtype)


KERNELS: dict[str, Callable] = {
    "conv": _conv,
    "shape": _shape,
    "batch_norm": _batch_norm,
    "gelu": _gelu,
    "matmul": _matmul,
}


def run_program(prog, inputs: dict[str, np.ndarray], function: str = "main") -> dict[str, np.ndarray]:
    """Evaluate ``prog.functions[function]`` on ``inputs`` (name -> array); returns output name -> array. Use it on
    ``model._mil_program`` of a converted model (after the fp16 passes) or on a builder program.

    Raises ``NotImplementedError`` naming the op when an op has neither value inference nor a kernel.

    The numpy kernels of :data:`KERNELS` replace value inference for ``conv`` and ``batch_norm`` (none exists),
    ``shape`` (returns the static symbolic shape), and ``gelu`` / ``matmul`` (correct but far too slow: gelu calls
    ``math.erf`` per element — here erf is a rational approximation with |error| <= 1.5e-7). The conv, batch_norm,
    gelu and matmul kernels compute in float32/float64 and round their output to the input dtype (what an fp16
    accelerator with wider accumulators does)."""
    fn = prog.functions[function]
    missing = set(fn.inputs) - set(inputs)
    if missing:
        raise ValueError(f"missing program inputs: {sorted(missing)}")
    env: dict[int, Any] = {}
    saved: list[tuple[Any, Any]] = []

    from coremltools.converters.mil.mil import types

    def bind(var, val) -> None:
        # Bind the value and make the variable's type concrete (several value inferences read the
        # static type shape, which is symbolic for EnumeratedShapes inputs); both are restored after.
        env[id(var)] = val
        saved.append((var, var._sym_val, var._sym_type))
        var._sym_val = _Bound(val)
        if types.is_tensor(var._sym_type) and isinstance(val, np.ndarray):
            var._sym_type = types.tensor(var._sym_type.get_primitive(), tuple(val.shape))

    def value(v):
        if isinstance(v, (list, tuple)):
            return type(v)(value(x) for x in v)
        if hasattr(v, "op") and hasattr(v, "_sym_val"):
            if id(v) in env:
                return env[id(v)]
            if v.val is not None:
                return v.val
            raise RuntimeError(f"variable {v.name} has no value")
        return v

    try:
        for name, var in fn.inputs.items():
            arr = np.asarray(inputs[name])
            arr = arr.astype(types.nptype_from_builtin(var.dtype))
            if len(arr.shape) != var.rank:
                raise ValueError(f"input {name}: rank {arr.ndim} != program rank {var.rank}")
            bind(var, arr)
        for op in fn.operations:
            if op.op_type == "const":
                continue
            for v in op.inputs.values():
                for x in v if isinstance(v, (list, tuple)) else (v,):
                    if id(x) not in env and x.val is None:
                        raise RuntimeError(f"op {op.name}: input {x.name} has no value")
            if op.op_type in KERNELS:
                result = KERNELS[op.op_type](op, value)
            else:
                try:
                    result = op.value_inference()
                except NotImplementedError:
                    raise NotImplementedError(
                        f"op {op.name} ({op.op_type}) has no value_inference and no numpy kernel"
                    ) from None
            outs = result if isinstance(result, (list, tuple)) and len(op.outputs) > 1 else (result,)
            for var, val in zip(op.outputs, outs):
                val = np.asarray(val) if not np.isscalar(val) else val
                if hasattr(val, "dtype") and var.dtype is not None:
                    if types.is_tensor(var.sym_type) or types.is_scalar(var.sym_type):
                        val = np.asarray(val).astype(types.nptype_from_builtin(var.dtype), copy=False)
                bind(var, val)
        return {v.name: np.asarray(value(v)) for v in fn.outputs}
    finally:
        for var, old_val, old_type in reversed(saved):
            var._sym_val, var._sym_type = old_val, old_type
