"""The GPT's one-token decode step in numpy, for the CPU.

On the CPU a decode step is memory-bound: it reads all block weights for one token. MLX's CPU backend sends
(1, D) @ (D, N) products through ``sgemm``, numpy through ``gemv``, several times faster for these shapes
(docs/performance.md, "The GPT step in numpy"). :class:`NumpyDecoder` is that
step, reading the model's own weights through zero-copy numpy views of the MLX arrays (no second copy in
memory). The math is :meth:`T2SModel.decode` (float32); with float16 weights (:func:`half_weights`) the step
runs on the C kernels instead."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ...runtime import DEFAULT, Runtime
from ..kernels import half_gemv, q8
from ..kernels.cpu_paths import path as stage_path
from ..kernels.half_matrix import HalfMatrix
from ..shared.storage import half_storage
from .model import T2SModel


def _view(a: mx.array) -> np.ndarray:
    """Zero-copy float32 numpy view of an evaluated MLX array (on the CPU / unified memory)."""
    mx.eval(a)
    out = np.array(a, copy=False)
    if out.dtype != np.float32:
        out = out.astype(np.float32)
    return out


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    mu = x.mean()
    d = x - mu
    var = np.dot(d, d) / np.float32(d.shape[0])
    return d * (w / np.sqrt(var + np.float32(eps))) + b


def _layer_norm_rows(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    d = x - mu
    var = (d * d).mean(axis=-1, keepdims=True)
    return d * (1.0 / np.sqrt(var + np.float32(eps))) * w + b


def _add_norm(x: np.ndarray, y: np.ndarray, w: np.ndarray, b: np.ndarray, fn, eps: float = 1e-5) -> np.ndarray:
    """``LayerNorm(x + y) * w + b`` over the last axis of the prefill's rows: in place in ``x`` in the kernel library
    when ``fn`` is there (rows on its threads), else :func:`_layer_norm_rows` in numpy."""
    if fn is None:
        return _layer_norm_rows(x + y, w, b, eps)
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.ascontiguousarray(y, dtype=np.float32)
    M, D = x.shape
    fn.add_layer_norm_rows(x.ctypes.data, y.ctypes.data, w.ctypes.data, b.ctypes.data, M, D, float(eps), fn.nthreads())
    return x


def _matrix(a: mx.array, fn):
    """A weight matrix for the step: a float16 one as a :class:`~.half_gemv.HalfMatrix` (zero-copy view,
    float16 reads with float32 accumulation) when the kernel ``fn`` is there, else a float32 view."""
    if fn is not None and a.dtype == mx.float16:
        mx.eval(a)
        return HalfMatrix(np.array(a, copy=False), fn)
    return _view(a)


def half_weights(model: T2SModel, runtime: Runtime = DEFAULT) -> bool:
    """Keep the GPT's Linear weights (blocks and head) in float16 for the numpy decode step
    (``models/kernels/half_gemv.py``): done in place when the kernel is available and every such weight is exactly
    a float16 value (the released checkpoints are float16, so nothing changes), or always with the runtime's
    ``gpt_half`` ``1``. Returns whether the model's weights are float16 now."""
    if half_gemv.kernel(runtime.isa, runtime.gpt_half) is None:
        return False
    linears = [b.attn.qkv for b in model.layers] + [b.attn.out for b in model.layers]
    linears += [b.mlp.fc1 for b in model.layers] + [b.mlp.fc2 for b in model.layers] + [model.predict]
    if all(m.weight.dtype == mx.float16 for m in linears):
        return True
    if half_gemv.mode(runtime.gpt_half) == "auto":
        for m in linears:
            w = m.weight
            if w.dtype == mx.float32 and not mx.array_equal(w.astype(mx.float16).astype(mx.float32), w).item():
                return False  # not float16 weights: keep them exact
    for layer in model.layers:
        half_storage(layer, min_elements=0)
    half_storage(model.predict, min_elements=0)
    if hasattr(mx, "clear_cache"):
        mx.clear_cache()  # hand the float32 buffers back
    return True


class _Layer:
    __slots__ = ("qkv_w", "qkv_b", "out_w", "out_b", "n1_w", "n1_b", "fc1_w", "fc1_b", "fc2_w", "fc2_b",
                 "n2_w", "n2_b")

    def __init__(self, block, fn=None):
        self.qkv_w, self.qkv_b = _matrix(block.attn.qkv.weight, fn), _view(block.attn.qkv.bias)
        self.out_w, self.out_b = _matrix(block.attn.out.weight, fn), _view(block.attn.out.bias)
        self.n1_w, self.n1_b = _view(block.norm1.weight), _view(block.norm1.bias)
        self.fc1_w, self.fc1_b = _matrix(block.mlp.fc1.weight, fn), _view(block.mlp.fc1.bias)
        self.fc2_w, self.fc2_b = _matrix(block.mlp.fc2.weight, fn), _view(block.mlp.fc2.bias)
        self.n2_w, self.n2_b = _view(block.norm2.weight), _view(block.norm2.bias)


class _Weights:
    """Zero-copy numpy views of one model's decode weights (float16 ones through ``half_gemv``).

    ``half``: None lets :func:`half_weights` decide; False keeps float32 (copies of float16 weights, e.g.
    to compare). ``runtime``: the kernels' build, the GPT's float16 mode, the prefill's path, the fused step."""

    def __init__(self, model: T2SModel, half: bool | None = None, runtime: Runtime = DEFAULT):
        a = model.args
        self.num_heads, self.head_dim, self.dim = a.num_heads, a.head_dim, a.hidden_dim
        self.scale = np.float32(1.0 / np.sqrt(a.head_dim))
        self.half = half_weights(model, runtime) if half is None or half else False
        fn = half_gemv.kernel(runtime.isa, runtime.gpt_half, runtime.threads) if self.half else None
        self.fused = runtime.fused_step  # float16 weights: blocks / prefill attention in one kernel call each
        self.prefill_gemm = stage_path("gpt_prefill", runtime)[0] if self.half else "float16"
        self.layers = [_Layer(b, fn) for b in model.layers]
        self.embedding = _view(model.audio_embedding.weight)
        self.alpha = np.float32(_view(model.audio_position.alpha)[0])
        self.predict = _matrix(model.predict.weight, fn)
        self.source = model.predict.weight  # identity check for stale views
        # the runtime's precision int8 (opt-in): the blocks' four products on int8 copies of their weights
        self.q8_fn = q8.kernel(runtime) if self.fused else None
        self.q8 = [q8.block_weights(b, self.q8_fn) for b in model.layers] if self.q8_fn is not None else None

    @property
    def precision(self) -> str:
        """The decode step's weights: ``int8`` (the opt-in reduced-precision step) or ``exact``."""
        return "int8" if self.q8 is not None else "exact"

    def step_kernels(self):
        """(the kernels that run the fused step, whether it is the int8 one)."""
        if self.q8 is not None:
            return self.q8_fn, True
        return self.predict.fn, False


def _linear(x: np.ndarray, w, b: np.ndarray, relu: bool = False, path: str = "float16") -> np.ndarray:
    """``x @ w.T + b`` (then ReLU) for the prefill's rows: a float16 weight on ``path`` (``float16``: the kernel's
    small-M GEMM, no float32 copy of the weight; ``float32``: upcast into a scratch buffer, BLAS; see
    ``cpu_paths``), a float32 one through BLAS."""
    if isinstance(w, HalfMatrix):
        return w.matmul_t(x, b, "relu" if relu else None, path=path)
    y = x @ w.T + b
    if relu:
        np.maximum(y, 0, out=y)
    return y


def _ffn(layer: _Layer, x: np.ndarray, h: np.ndarray) -> np.ndarray:
    """The decode step's ``fc2 @ relu(fc1 @ x + b1)`` (without fc2's bias, added by the caller as before): with float16
    weights one kernel call for both products (one parallel region), each value as the separate calls give it."""
    w1, w2 = layer.fc1_w, layer.fc2_w
    if isinstance(w1, HalfMatrix) and isinstance(w2, HalfMatrix):
        x = np.ascontiguousarray(x, dtype=np.float32)
        y = np.empty(w2.shape[0], dtype=np.float32)
        b1 = layer.fc1_b
        w1.fn.ffn(w1.w.ctypes.data, b1.ctypes.data, w2.w.ctypes.data, None, x.ctypes.data, h.ctypes.data,
                  y.ctypes.data, w1.shape[1], w1.shape[0])
        return y
    hh = w1 @ x + layer.fc1_b
    np.maximum(hh, 0, out=hh)
    return w2 @ hh


def _kernels(dec: _Weights):
    """The float16 kernel library when every block weight is a ``HalfMatrix``, else None."""
    if dec.layers and all(isinstance(m, HalfMatrix) for layer in dec.layers
                          for m in (layer.qkv_w, layer.out_w, layer.fc1_w, layer.fc2_w)):
        return dec.layers[0].qkv_w.fn
    return None


def _fused_pointers(dec: _Weights, keys: list[np.ndarray], values: list[np.ndarray]):
    """The per-layer pointers ``half_gemv``'s ``decode_layers`` reads (weights, biases, norms, this state's KV
    cache), or None when the weights are not all float16 ``HalfMatrix`` objects."""
    import ctypes

    if dec.q8 is not None:  # the int8 step: 18 entries per layer (the four row scales after K, V)
        ptrs = []
        for layer, (qkv, out, fc1, fc2), K, V in zip(dec.layers, dec.q8, keys, values):
            arrays = (qkv.q, layer.qkv_b, out.q, layer.out_b, layer.n1_w, layer.n1_b, fc1.q, layer.fc1_b, fc2.q,
                      layer.fc2_b, layer.n2_w, layer.n2_b, K, V, qkv.s, out.s, fc1.s, fc2.s)
            for a in arrays:
                if not (a.flags.c_contiguous and a.dtype in (np.int8, np.float32)):
                    return None
            ptrs += [a.ctypes.data for a in arrays]
        return (ctypes.c_void_p * len(ptrs))(*ptrs)
    if not dec.layers or not all(isinstance(m, HalfMatrix) for layer in dec.layers
                                 for m in (layer.qkv_w, layer.out_w, layer.fc1_w, layer.fc2_w)):
        return None
    ptrs = []
    for layer, K, V in zip(dec.layers, keys, values):
        arrays = (layer.qkv_w.w, layer.qkv_b, layer.out_w.w, layer.out_b, layer.n1_w, layer.n1_b, layer.fc1_w.w,
                  layer.fc1_b, layer.fc2_w.w, layer.fc2_b, layer.n2_w, layer.n2_b, K, V)
        for a in arrays:
            if not (a.flags.c_contiguous and a.dtype in (np.float16, np.float32)):
                return None
        ptrs += [a.ctypes.data for a in arrays]
    return (ctypes.c_void_p * len(ptrs))(*ptrs)


class NumpyDecoder:
    """The :class:`~.t2s.Decoder` computing in numpy (the CPU fast path) from views of the model's weights, one of
    the implementations ``decode.make_decoder`` chooses from when the model is loaded. Built on first use (or at
    :meth:`warmup`) and rebuilt when the model's weights are replaced.

    The math is :meth:`T2SModel.decode` (float32): embedding + alpha * pe, post-norm blocks with packed qkv,
    attention over the cache rows 0..slot, ReLU FFN, bias-free head. :meth:`prefill` runs the prefix in numpy too:
    the products go to the same BLAS, and MLX's CPU ``exp`` is scalar (ten times numpy's on the attention scores).

    With float16 weights (:func:`half_weights`) the step reads them through the ``half_gemv`` kernel (float32
    accumulation): the same weights, half the bytes per token (docs/performance.md, "float16 kernels"); then it runs
    every block in one kernel call (``decode_layers``; the runtime's ``fused_step``) on the kernels' threads
    (``half_gemv.threads``), and the prefill's products take the path ``cpu_paths`` chooses for this CPU (the
    kernel's float16 GEMM, or BLAS on each weight upcast into a scratch buffer, the float32 model's products)."""

    kind = "numpy"
    backend = "numpy"

    def __init__(self, model: T2SModel, half: bool | None = None, runtime: Runtime = DEFAULT):
        self.model, self.runtime = model, runtime
        self.half_setting = half  # None: automatic (see half_weights); False: float32
        self._weights: _Weights | None = None

    def weights(self) -> _Weights:
        """The numpy views, (re)built when missing or when the model's weights were replaced."""
        w = self._weights
        if w is None or w.source is not self.model.predict.weight:
            w = self._weights = _Weights(self.model, self.half_setting, self.runtime)
        return w

    @property
    def half(self) -> bool:
        """Whether the step reads float16 weights (``half_gemv``)."""
        return self.weights().half

    def warmup(self, prefix_rows: int = 256) -> None:
        self.weights()

    def prefill(
        self, phones: np.ndarray, bert: np.ndarray, prompt: np.ndarray, max_new: int
    ) -> tuple[NumpyDecodeState, np.ndarray]:
        """:meth:`T2SModel.prefill` in numpy: the prefix ``[text ; audio]`` (embedded by the model in
        MLX) through every block with the prefix mask; returns the decode state (cache rows 0..T-1
        filled, room for ``max_new`` more) and the raw logits (V,) of the first new token."""
        w, model = self.weights(), self.model
        n_text = int(phones.shape[1])
        xy = model.embed_prefix(mx.array(phones), mx.array(bert).astype(mx.float32), mx.array(prompt))
        x = np.array(xy[0], dtype=np.float32)
        T = x.shape[0]
        row, col = np.arange(T)[:, None], np.arange(T)[None, :]
        blocked = ~((col < n_text) | ((row >= n_text) & (col <= row)))  # True = may not attend
        mask = np.where(blocked, np.float32(-np.inf), np.float32(0.0))  # added: the same scores as assigning -inf
        state = NumpyDecodeState(w, model, T + max_new)
        H, hd, D = w.num_heads, w.head_dim, w.dim
        fn = _kernels(w) if w.fused else None  # float16 weights: the attention in the kernel library too
        scratch = np.empty(H * (hd * T + T), dtype=np.float32) if fn is not None else None
        gemm = w.prefill_gemm
        for layer, K, V in zip(w.layers, state.keys, state.values):
            qkv = _linear(x, layer.qkv_w, layer.qkv_b, path=gemm)
            if fn is not None:  # one head per chunk on the kernels' threads, BLAS's threads left alone
                o = np.empty((T, D), dtype=np.float32)
                fn.prefill_attention(qkv.ctypes.data, K.ctypes.data, V.ctypes.data, o.ctypes.data, scratch.ctypes.data,
                                     T, D, H, K.shape[1], n_text, float(w.scale), fn.nthreads())
            else:
                q = qkv[:, :D].reshape(T, H, hd).transpose(1, 0, 2)
                K[:, :T] = qkv[:, D : 2 * D].reshape(T, H, hd).transpose(1, 0, 2)
                V[:, :T] = qkv[:, 2 * D :].reshape(T, H, hd).transpose(1, 0, 2)
                s = np.matmul(q, K[:, :T].transpose(0, 2, 1)) * w.scale  # (H, T, T)
                s += mask
                s = np.exp(s - s.max(axis=-1, keepdims=True))
                s /= s.sum(axis=-1, keepdims=True)
                o = np.matmul(s, V[:, :T]).transpose(1, 0, 2).reshape(T, D)
            x = _add_norm(x, _linear(o, layer.out_w, layer.out_b, path=gemm), layer.n1_w, layer.n1_b, fn)
            h = _linear(x, layer.fc1_w, layer.fc1_b, relu=True, path=gemm)
            x = _add_norm(x, _linear(h, layer.fc2_w, layer.fc2_b, path=gemm), layer.n2_w, layer.n2_b, fn)
        state.offset = T
        return state, w.predict @ x[-1]


MAX_BATCH = 16  # rows of one batched step (the kernel's bound)


def step_batch(states: list[NumpyDecodeState], tokens: list[int], positions: list[int]) -> list[np.ndarray]:
    """One decode step for several generations of the same model at once: ``states[i]`` is fed ``tokens[i]`` at
    ``positions[i]``. With float16 weights the blocks run in one kernel call that reads each weight once for all
    rows (the step is bound by memory: a second row costs little); every row's logits are bit-identical to its
    :meth:`NumpyDecodeState.step` alone. Otherwise, or for rows of different weights, the rows step one by one."""
    import ctypes

    if not states:
        return []
    d = states[0].dec
    if (len(states) == 1 or len(states) > MAX_BATCH or not d.fused
            or any(s.dec is not d or s._fused is None for s in states)):
        return [s.step(t, p) for s, t, p in zip(states, tokens, positions)]
    xs = []
    for s, token, position in zip(states, tokens, positions):
        if s.offset >= s.keys[0].shape[1]:
            raise RuntimeError(f"numpy KV cache is full ({s.offset} rows)")
        xs.append(s._input(token, position))
    n = len(states)
    P = ctypes.c_void_p
    tables = (P * n)(*[ctypes.cast(s._fused, P) for s in states])
    caps = (ctypes.c_int64 * n)(*[s.keys[0].shape[1] for s in states])
    ts = (ctypes.c_int64 * n)(*[s.offset for s in states])
    xp = (P * n)(*[x.ctypes.data for x in xs])
    sp = (P * n)(*[s._scratch.ctypes.data for s in states])
    fn, int8 = d.step_kernels()
    batch = fn.decode_layers_batch_q8 if int8 else fn.decode_layers_batch
    if batch(tables, n, caps, ts, xp, sp, len(d.layers), d.dim, d.num_heads, states[0]._h.shape[0],
             float(d.scale), 1e-5, fn.nthreads()) != 0:
        raise RuntimeError(f"the batched decode step refused {n} rows")
    for s in states:
        s.offset += 1
    return [d.predict @ x for x in xs]


class NumpyDecodeState:
    """The numpy KV cache of one generation and its :meth:`step`."""

    def __init__(self, dec: _Weights, model: T2SModel, capacity: int):
        self.dec = dec
        self.pe_source = model
        cap = max(int(capacity), 1)
        H, hd = dec.num_heads, dec.head_dim
        self.keys = [np.zeros((H, cap, hd), dtype=np.float32) for _ in dec.layers]
        self.values = [np.zeros((H, cap, hd), dtype=np.float32) for _ in dec.layers]
        self.offset = 0
        self._pe_src: mx.array | None = None
        self._pe = np.zeros((0, dec.dim), dtype=np.float32)
        self._h = np.empty(dec.layers[0].fc1_b.shape[0], dtype=np.float32) if dec.layers else None  # ffn scratch
        self._fused = _fused_pointers(dec, self.keys, self.values)
        if self._fused is not None:
            F = dec.layers[0].fc1_b.shape[0]
            self._scratch = np.empty(5 * dec.dim + F + H * cap, dtype=np.float32)

    def _input(self, token: int, position: int) -> np.ndarray:
        """The step's input row: the token's embedding plus its scaled position (float32, contiguous)."""
        d = self.dec
        pe = self.pe_source.positions(position + 1)
        if pe is not self._pe_src:
            self._pe_src, self._pe = pe, _view(pe)
        return np.ascontiguousarray(d.embedding[token] + d.alpha * self._pe[position], dtype=np.float32)

    def step(self, token: int, position: int) -> np.ndarray:
        """Feed ``token`` at audio position ``position`` into cache row ``offset``; returns the raw
        logits (V,) for the next token."""
        d = self.dec
        t = self.offset
        if t >= self.keys[0].shape[1]:
            raise RuntimeError(f"numpy KV cache is full ({t} rows)")
        x = self._input(token, position)
        H, hd = d.num_heads, d.head_dim
        n = t + 1
        if self._fused is not None and d.fused:  # every block in one kernel call (float16 or int8 weights)
            fn, int8 = d.step_kernels()
            run = fn.decode_layers_q8 if int8 else fn.decode_layers
            run(self._fused, len(d.layers), self.keys[0].shape[1], t, x.ctypes.data, self._scratch.ctypes.data, d.dim,
                H, self._h.shape[0], float(d.scale), 1e-5, fn.nthreads())
            self.offset = n
            return d.predict @ x
        for layer, K, V in zip(d.layers, self.keys, self.values):
            qkv = layer.qkv_w @ x + layer.qkv_b
            q = qkv[: d.dim].reshape(H, hd, 1)
            K[:, t] = qkv[d.dim : 2 * d.dim].reshape(H, hd)
            V[:, t] = qkv[2 * d.dim :].reshape(H, hd)
            s = np.matmul(K[:, :n], q)[:, :, 0] * d.scale  # (H, n)
            s = np.exp(s - s.max(axis=1, keepdims=True))
            s /= s.sum(axis=1, keepdims=True)
            o = np.matmul(s[:, None, :], V[:, :n]).reshape(d.dim)  # (H, 1, hd) -> (D,)
            x = _layer_norm(x + layer.out_w @ o + layer.out_b, layer.n1_w, layer.n1_b)
            x = _layer_norm(x + _ffn(layer, x, self._h) + layer.fc2_b, layer.n2_w, layer.n2_b)
        self.offset = n
        return d.predict @ x
