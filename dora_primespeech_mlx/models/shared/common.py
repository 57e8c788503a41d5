"""Numpy helpers shared by the models' ``sanitize`` functions (checkpoint layout -> MLX layout)."""

from __future__ import annotations

import numpy as np

_G, _V = ".weight_g", ".weight_v"
_P0, _P1 = ".parametrizations.weight.original0", ".parametrizations.weight.original1"


def fold_weight_norm(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Replace every weight-norm pair (``weight_g``/``weight_v`` or the new ``parametrizations`` names)
    by the effective ``weight = g * v / ||v||``, computed in float32.

    The norm is taken over the axes where ``g`` has size 1: all axes but 0 for ordinary weight norm
    (Conv1d ``g`` is (out, 1, 1); ConvTranspose1d ``g`` is (in, 1, 1)), all axes but 2 for HuBERT's
    positional conv (``g`` is (1, 1, K)).
    """
    out: dict[str, np.ndarray] = {}
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for key, value in weights.items():
        for g_suffix, v_suffix in ((_G, _V), (_P0, _P1)):
            if key.endswith(g_suffix):
                pairs.setdefault(key[: -len(g_suffix)], {})["g"] = value
                break
            if key.endswith(v_suffix):
                pairs.setdefault(key[: -len(v_suffix)], {})["v"] = value
                break
        else:
            out[key] = value
    for prefix, pair in pairs.items():
        if set(pair) != {"g", "v"}:
            raise ValueError(f"incomplete weight-norm pair for '{prefix}' (have {sorted(pair)})")
        g = pair["g"].astype(np.float32)
        v = pair["v"].astype(np.float32)
        # Size-1 axes of v add nothing to the sum, so including them where g is also 1 is harmless.
        axes = tuple(d for d in range(v.ndim) if g.shape[d] == 1)
        norm = np.sqrt(np.sum(v.astype(np.float64) ** 2, axis=axes, keepdims=True)).astype(np.float32)
        out[prefix + ".weight"] = g * v / norm
    return out


def to_float32(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Upcast floating-point arrays (fp16/bf16 storage) to float32; leave integers alone."""
    return {k: (v.astype(np.float32) if np.issubdtype(v.dtype, np.floating) else v) for k, v in weights.items()}


def strip_prefix(weights: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    return {k[len(prefix) :] if k.startswith(prefix) else k: v for k, v in weights.items()}
