"""RoBERTa (:class:`~.bert.BertModel`) with float16 weights on the CPU: numpy plus the float16-weight GEMM kernel.

MLX keeps float16 weights only as storage on the CPU: each product upcasts the weight, and RoBERTa-large in
float32 holds twice the memory. Here every Linear layer runs on the path ``cpu_paths`` chooses for this CPU:
``half_gemv``'s small-M GEMM (``Y = X @ W.T + b``, W float16 converted in registers, float32 accumulation, the
configured threads; the FFN's exact GELU in the same call), or BLAS on the weight upcast into a scratch buffer
(``half_matrix``); the rest (embeddings, LayerNorm, the attention of ~23 tokens) in numpy float32. The weights
are zero-copy numpy views of the model's float16 MLX arrays: half the memory, and faster than the float32 MLX
model (docs/performance.md, "float16 kernels").

The math is :meth:`BertModel.__call__`'s (float32 compute): embeddings = LayerNorm(word[ids] + position +
token_type[0]); post-LN layers ``x = LN(x + Attn(x)); x = LN(x + FFN(x))``; padded keys masked out."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..kernels.half_matrix import HalfMatrix


def _np(a: mx.array) -> np.ndarray:
    """Zero-copy numpy view of an evaluated MLX array (float16 weights stay float16)."""
    mx.eval(a)
    return np.array(a, copy=False)


def _f32(a: mx.array) -> np.ndarray:
    out = _np(a)
    return out if out.dtype == np.float32 else out.astype(np.float32)


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    d = x - mu
    var = (d * d).mean(axis=-1, keepdims=True)
    return d * (1.0 / np.sqrt(var + np.float32(eps))) * w + b


class _Layer:
    __slots__ = ("q", "k", "v", "out", "up", "down", "qb", "kb", "vb", "outb", "upb", "downb", "n1w", "n1b",
                 "n2w", "n2b")

    def __init__(self, layer, fn):
        a, f = layer.attention, layer.ffn
        self.q, self.k, self.v = (HalfMatrix(_np(m.weight), fn) for m in (a.query, a.key, a.value))
        self.out, self.up, self.down = (HalfMatrix(_np(m.weight), fn) for m in (a.out, f.up, f.down))
        self.qb, self.kb, self.vb, self.outb = (_f32(m.bias) for m in (a.query, a.key, a.value, a.out))
        self.upb, self.downb = _f32(f.up.bias), _f32(f.down.bias)
        self.n1w, self.n1b = _f32(layer.attention_norm.weight), _f32(layer.attention_norm.bias)
        self.n2w, self.n2b = _f32(layer.ffn_norm.weight), _f32(layer.ffn_norm.bias)


class NumpyBert:
    """``BertModel.__call__`` in numpy with the float16-weight kernels ``fn`` (``half_gemv.library()``); every
    Linear weight of the model must be float16 (``storage.half_storage(model, min_elements=0)``). ``gemm``: the
    products' path (``float16`` kernel GEMM or ``float32`` BLAS on the upcast weight; ``cpu_paths.path``)."""

    def __init__(self, model, fn, gemm: str = "float16"):
        self.gemm = gemm
        args = model.args
        self.eps = float(args.layer_norm_eps)
        self.heads = int(args.num_attention_heads)
        self.hidden = int(args.hidden_size)
        e = model.embeddings
        self.word = _np(e.word_embeddings.weight)  # (V, H), float16 or float32: rows are gathered then upcast
        self.position = _f32(e.position_embeddings.weight)
        self.token_type0 = _f32(e.token_type_embeddings.weight[0])
        self.norm_w, self.norm_b = _f32(e.norm.weight), _f32(e.norm.bias)
        self.layers = [_Layer(layer, fn) for layer in model.layers]
        self.source = model.layers[0].attention.query.weight if model.layers else e.word_embeddings.weight

    def __call__(
        self, input_ids: np.ndarray, attention_mask: np.ndarray | None = None, output_hidden_states: bool = False
    ) -> np.ndarray | list[np.ndarray]:
        """(B, L) ids -> (B, L, H) float32 (or the list of hidden states), as :meth:`BertModel.__call__`."""
        ids = np.asarray(input_ids)
        B, L = ids.shape
        H, D = self.heads, self.hidden
        hd = D // H
        x = self.word[ids].astype(np.float32) + self.position[:L] + self.token_type0
        x = _layer_norm(x, self.norm_w, self.norm_b, self.eps).reshape(B * L, D)
        keep = None if attention_mask is None else (np.asarray(attention_mask) != 0)[:, None, None, :]
        scale = np.float32(hd**-0.5)
        hidden = [x.reshape(B, L, D)]
        p = self.gemm  # float16 GEMM or BLAS on the upcast weight, per CPU (models/kernels/cpu_paths.py)
        for layer in self.layers:
            q = layer.q.matmul_t(x, layer.qb, path=p).reshape(B, L, H, hd).transpose(0, 2, 1, 3)
            k = layer.k.matmul_t(x, layer.kb, path=p).reshape(B, L, H, hd).transpose(0, 2, 3, 1)
            v = layer.v.matmul_t(x, layer.vb, path=p).reshape(B, L, H, hd).transpose(0, 2, 1, 3)
            s = np.matmul(q * scale, k)  # (B, H, L, L)
            if keep is not None:
                s = np.where(keep, s, np.float32(-np.inf))
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            o = np.matmul(s, v).transpose(0, 2, 1, 3).reshape(B * L, D)
            x = _layer_norm(x + layer.out.matmul_t(o, layer.outb, path=p), layer.n1w, layer.n1b, self.eps)
            h = layer.up.matmul_t(x, layer.upb, "gelu", path=p)
            x = _layer_norm(x + layer.down.matmul_t(h, layer.downb, path=p), layer.n2w, layer.n2b, self.eps)
            if output_hidden_states:
                hidden.append(x.reshape(B, L, D))
        return hidden if output_hidden_states else x.reshape(B, L, D)
