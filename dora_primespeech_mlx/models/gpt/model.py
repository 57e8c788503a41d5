"""GPT-SoVITS text-to-semantic GPT (``AR/models/t2s_model.py`` ``Text2SemanticDecoder``), inference only.

The model is pure math (docs/model.md, "GPT: text to semantic tokens"; :class:`T2SModel` gives it). The KV cache
it fills is :class:`.kv_cache.KVCache` (per-layer ``keys``/``values`` arrays of shape (1, heads, capacity, head_dim),
``offset``, ``reserve(n)``; made by :meth:`T2SModel.make_cache`). :meth:`T2SModel.decode` is the one-token step
as a pure function of arrays whose shapes only change when the cache grows by a bucket, so it can be wrapped by
``mx.compile`` or swapped for another backend without touching the loop.

How the decode steps run is a :class:`Decoder` (declared here, implemented in ``decode.py``: MLX
eager, MLX compiled, numpy), chosen once when the model is loaded and kept in ``T2SModel.decoder``;
sampling and the decode loop live in ``generate.py``."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..shared.common import strip_prefix, to_float32
from .kv_cache import CACHE_STEP, KVCache

BERT_DIM = 1024  # bert_proj is Linear(1024, D) in the original, whatever BERT the config names
DecodeFn = Callable[..., tuple[mx.array, list[mx.array], list[mx.array]]]  # T2SModel.decode's form
PE_ROWS = 4000  # the original builds its sinusoid table with 4000 rows and extends it on demand
TOKENS_PER_SEC = 50  # TTS.run: early_stop_num = 50 * data.max_sec
MAX_SEC = 600.0  # the most data.max_sec accepted (released configs: 54): a GPT without EOS stops in bounded time


@dataclass
class T2SArgs:
    hidden_dim: int = 512
    embedding_dim: int = 512
    num_heads: int = 16
    num_layers: int = 24
    phoneme_vocab_size: int = 732
    vocab_size: int = 1025
    eos: int = 1024
    max_sec: float = 54

    @property
    def head_dim(self) -> int:
        return self.hidden_dim // self.num_heads

    @property
    def ffn_dim(self) -> int:
        return 4 * self.hidden_dim  # the original ignores config "linear_units"

    @property
    def early_stop_num(self) -> int:
        """What ``TTS.run`` passes to the decoder: ``50 * max_sec`` tokens."""
        return int(TOKENS_PER_SEC * self.max_sec)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> T2SArgs:
        """From a GPT checkpoint's whole config (``"model"`` section plus ``"data"["max_sec"]``)."""
        if "model" not in config:
            raise ValueError("GPT config has no 'model' section")
        m = config["model"]
        missing = [k for k in ("hidden_dim", "head", "n_layer", "phoneme_vocab_size", "vocab_size") if k not in m]
        if missing:
            raise ValueError(f"GPT config['model'] lacks {missing}")
        max_sec = (config.get("data") or {}).get("max_sec")
        if max_sec is None:
            raise ValueError("GPT config has no data.max_sec (needed for early_stop_num = 50 * max_sec)")
        args = cls(
            hidden_dim=int(m["hidden_dim"]),
            embedding_dim=int(m.get("embedding_dim", m["hidden_dim"])),
            num_heads=int(m["head"]),
            num_layers=int(m["n_layer"]),
            phoneme_vocab_size=int(m["phoneme_vocab_size"]),
            vocab_size=int(m["vocab_size"]),
            eos=int(m.get("EOS", int(m["vocab_size"]) - 1)),
            max_sec=max_sec,
        )
        args.validate()
        return args

    def validate(self) -> None:
        if self.embedding_dim != self.hidden_dim:
            raise ValueError(f"embedding_dim {self.embedding_dim} != hidden_dim {self.hidden_dim} is not supported")
        if self.hidden_dim % self.num_heads:
            raise ValueError(f"hidden_dim {self.hidden_dim} is not divisible by head {self.num_heads}")
        if self.eos != self.vocab_size - 1:
            raise ValueError(f"EOS {self.eos} must be vocab_size - 1 ({self.vocab_size - 1})")
        sec = self.max_sec
        if isinstance(sec, bool) or not isinstance(sec, numbers.Real) or not 0 < float(sec) <= MAX_SEC:
            raise ValueError(f"GPT config data.max_sec {sec!r:.40}: expected a number of seconds in (0, {MAX_SEC:g}] "
                             "(the released configs say 54)")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class DecodeSession(Protocol):
    """The decode state of one generation (its KV cache)."""

    def step(self, token: int, position: int) -> np.ndarray:
        """Feed ``token`` at audio position ``position``; the raw logits (V,) float32 of the next token."""
        ...


class Decoder(Protocol):
    """How a :class:`T2SModel` runs its prefix and its one-token steps (MLX eager, MLX compiled or
    numpy: ``decode.make_decoder``). Every implementation computes the same float32 math."""

    kind: str  # "mlx" | "compile" | "numpy"
    backend: str  # what computes the steps: "mlx" | "numpy"

    def prefill(
        self, phones: np.ndarray, bert: np.ndarray, prompt: np.ndarray, max_new: int
    ) -> tuple[DecodeSession, np.ndarray]:
        """Run the prefix (phones (1, Tx) int32, bert (1, 1024, Tx) float32, prompt (1, Ty) int32) with
        room for ``max_new`` tokens; returns the session and the raw logits (V,) of the first token."""
        ...

    def warmup(self, prefix_rows: int = 256) -> None:
        """Build ahead of the first request what it would otherwise pay for."""
        ...


def sine_table(rows: int, dim: int) -> np.ndarray:
    """Interleaved sinusoid table in float32, computed like ``SinePositionalEmbedding.extend_pe``:
    ``pe[p, 2i] = sin(p * w_i)``, ``pe[p, 2i+1] = cos(p * w_i)``, ``w_i = exp(-2i * ln(10000) / dim)``."""
    position = np.arange(rows, dtype=np.float32)[:, None]
    div_term = np.exp(np.arange(0, dim, 2, dtype=np.float32) * np.float32(-(math.log(10000.0) / dim)))
    angle = position * div_term
    pe = np.zeros((rows, dim), dtype=np.float32)
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle)
    return pe


def prefix_mask(n_text: int, n_audio: int) -> mx.array:
    """Boolean (T, T) mask, True = may attend: text rows see all text, audio rows see text + causal audio."""
    t = n_text + n_audio
    col = mx.arange(t)[None, :]
    row = mx.arange(t)[:, None]
    return (col < n_text) | ((row >= n_text) & (col <= row))


class PositionScale(nn.Module):
    """The learned scalar ``alpha`` of one sinusoidal stream (``out = x + alpha * pe``)."""

    def __init__(self):
        super().__init__()
        self.alpha = mx.ones((1,))


class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.scale = 1.0 / math.sqrt(dim // num_heads)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def project(self, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """(B, T, D) -> q, k, v as (B, H, T, D/H); the packed rows are [q; k; v]."""
        B, T, _ = x.shape
        q, k, v = mx.split(self.qkv(x), 3, axis=-1)
        return tuple(t.reshape(B, T, self.num_heads, -1).transpose(0, 2, 1, 3) for t in (q, k, v))

    def attend(self, q: mx.array, k: mx.array, v: mx.array, mask: mx.array) -> mx.array:
        B, _, T, _ = q.shape
        o = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)
        return self.out(o.transpose(0, 2, 1, 3).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def __call__(self, x: mx.array) -> mx.array:
        return self.fc2(nn.relu(self.fc1(x)))


class Block(nn.Module):
    """Post-norm transformer block."""

    def __init__(self, args: T2SArgs):
        super().__init__()
        self.attn = Attention(args.hidden_dim, args.num_heads)
        self.norm1 = nn.LayerNorm(args.hidden_dim, eps=1e-5)
        self.mlp = MLP(args.hidden_dim, args.ffn_dim)
        self.norm2 = nn.LayerNorm(args.hidden_dim, eps=1e-5)

    def _finish(self, x: mx.array, attn: mx.array) -> mx.array:
        x = self.norm1(x + attn)
        return self.norm2(x + self.mlp(x))

    def prefill(self, x: mx.array, mask: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """Whole prefix; returns the output and this layer's keys/values (B, H, T, D/H)."""
        q, k, v = self.attn.project(x)
        return self._finish(x, self.attn.attend(q, k, v, mask)), k, v

    def decode(
        self, x: mx.array, slot: mx.array, keys: mx.array, values: mx.array, mask: mx.array
    ) -> tuple[mx.array, mx.array, mx.array]:
        """One token: write its k/v at ``slot`` of the preallocated (B, H, C, D/H) cache and attend
        over the cache with ``mask`` (True for columns 0..slot)."""
        q, k, v = self.attn.project(x)
        keys = mx.slice_update(keys, k, slot, axes=(2,))
        values = mx.slice_update(values, v, slot, axes=(2,))
        return self._finish(x, self.attn.attend(q, keys, values, mask)), keys, values


class T2SModel(nn.Module):
    """The text-to-semantic GPT (docs/model.md, "GPT: text to semantic tokens"):

    - text stream: ``text_embedding(phones) + bert_proj(bert.T) + alpha_t * pe[0..Tx)``;
      audio stream: ``audio_embedding(prompt) + alpha_a * pe[0..Ty)``; the input is ``[text ; audio]``;
    - post-norm blocks ``x = LN1(x + MHA(x)); x = LN2(x + W2 relu(W1 x))`` (LayerNorm eps 1e-5, packed qkv,
      FFN width 4 * hidden), no final norm, bias-free head over 1024 codes + EOS;
    - prefix mask: text rows see all text and no audio, audio rows see all text and causal audio;
      every decoded token sees everything before it."""

    def __init__(self, args: T2SArgs):
        super().__init__()
        args.validate()
        self.args = args
        D = args.hidden_dim
        self.bert_proj = nn.Linear(BERT_DIM, D)
        self.text_embedding = nn.Embedding(args.phoneme_vocab_size, D)
        self.text_position = PositionScale()
        self.audio_embedding = nn.Embedding(args.vocab_size, D)
        self.audio_position = PositionScale()
        self.layers = [Block(args) for _ in range(args.num_layers)]
        self.predict = nn.Linear(D, args.vocab_size, bias=False)
        self._pe = mx.array(sine_table(PE_ROWS, D))  # underscore: not a parameter
        self.decoder: Decoder | None = None  # set once at load (decode.make_decoder); a plain attribute

    # ---- positions -------------------------------------------------------------------------------
    def positions(self, rows: int) -> mx.array:
        """The sinusoid table with at least ``rows`` rows (extended on demand, like the original)."""
        if self._pe.shape[0] < rows:
            self._pe = mx.array(sine_table(rows, self.args.hidden_dim))
        return self._pe

    # ---- inputs ----------------------------------------------------------------------------------
    def embed_text(self, phones: mx.array, bert: mx.array) -> mx.array:
        """phones (1, Tx) int, bert (1, 1024, Tx) -> (1, Tx, D)."""
        Tx = phones.shape[1]
        if bert.shape[1] != BERT_DIM or bert.shape[2] != Tx:
            raise ValueError(f"bert features must be (1, {BERT_DIM}, {Tx}) for {Tx} phones, got {bert.shape}")
        x = self.text_embedding(phones) + self.bert_proj(bert.transpose(0, 2, 1))
        return x + self.text_position.alpha * self.positions(Tx)[:Tx]

    def embed_audio(self, tokens: mx.array, start: int = 0) -> mx.array:
        """tokens (1, T) int -> (1, T, D) with audio positions start..start+T-1."""
        T = tokens.shape[1]
        pe = self.positions(start + T)[start : start + T]
        return self.audio_embedding(tokens) + self.audio_position.alpha * pe

    def embed_prefix(self, phones: mx.array, bert: mx.array, prompt: mx.array) -> mx.array:
        """``xy_pos``: (1, Tx + Ty, D) transformer input ``[text ; audio]``."""
        x = self.embed_text(phones, bert)
        if prompt.shape[1] == 0:
            return x
        return mx.concatenate([x, self.embed_audio(prompt)], axis=1)

    def make_cache(self, step: int = CACHE_STEP) -> KVCache:
        """An empty KV cache for this model, growing ``step`` rows at a time."""
        a = self.args
        return KVCache(a.num_layers, a.num_heads, a.head_dim, step)

    # ---- forward passes --------------------------------------------------------------------------
    def prefill(self, phones: mx.array, bert: mx.array, prompt: mx.array, cache: KVCache) -> mx.array:
        """Run the prefix, fill ``cache`` (its offset becomes Tx + Ty) and return the logits (1, V)
        for the first new token (raw: before EOS masking and repetition penalty)."""
        phones = mx.array(phones).astype(mx.int32)
        prompt = mx.array(prompt).astype(mx.int32)
        x = self.embed_prefix(phones, bert.astype(mx.float32), prompt)
        T = x.shape[1]
        mask = prefix_mask(phones.shape[1], prompt.shape[1])
        cache.reserve(T)
        for i, layer in enumerate(self.layers):
            x, k, v = layer.prefill(x, mask)
            cache.keys[i] = mx.slice_update(cache.keys[i], k, mx.array([0]), axes=(2,))
            cache.values[i] = mx.slice_update(cache.values[i], v, mx.array([0]), axes=(2,))
        cache.offset = T
        return self.predict(x[:, -1])

    def decode(
        self,
        token: mx.array,
        position: mx.array,
        slot: mx.array,
        keys: list[mx.array],
        values: list[mx.array],
    ) -> tuple[mx.array, list[mx.array], list[mx.array]]:
        """One decode step as a pure function of arrays: ``token`` (1, 1) int32, ``position`` (1,) int32
        audio position of the token, ``slot`` (1,) int32 its cache row; ``keys``/``values`` per layer
        (1, H, C, D/H). Returns (logits (1, V), new keys, new values). Shapes depend only on C."""
        capacity = keys[0].shape[2]
        x = self.audio_embedding(token) + self.audio_position.alpha * self._pe[position]
        mask = (mx.arange(capacity) <= slot)[None, None, None, :]
        new_keys, new_values = [], []
        for layer, k, v in zip(self.layers, keys, values):
            x, k, v = layer.decode(x, slot, k, v, mask)
            new_keys.append(k)
            new_values.append(v)
        return self.predict(x[:, -1]), new_keys, new_values

    def step(self, token: int, position: int, cache: KVCache, decode: DecodeFn | None = None) -> mx.array:
        """Feed one token with audio position ``position`` (Ty + k for the k-th generated token) at
        cache row ``cache.offset``; returns the logits (1, V) for the next token. ``decode`` replaces
        :meth:`decode` (same signature: e.g. its ``mx.compile``'d form)."""
        self.positions(position + 1)
        cache.reserve(cache.offset + 1)
        logits, cache.keys, cache.values = (decode or self.decode)(
            mx.array([[token]], dtype=mx.int32),
            mx.array([position], dtype=mx.int32),
            mx.array([cache.offset], dtype=mx.int32),
            cache.keys,
            cache.values,
        )
        cache.offset += 1
        return logits

    # ---- checkpoint ------------------------------------------------------------------------------
    @staticmethod
    def sanitize(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Original ``.ckpt`` names (``model.`` prefix) -> this module's names, float32."""
        out: dict[str, np.ndarray] = {}
        for key, value in to_float32(strip_prefix(weights, "model.")).items():
            out[_rename(key)] = value
        return out


_RENAMES = (
    ("ar_text_embedding.word_embeddings.", "text_embedding."),
    ("ar_audio_embedding.word_embeddings.", "audio_embedding."),
    ("ar_text_position.", "text_position."),
    ("ar_audio_position.", "audio_position."),
    ("ar_predict_layer.", "predict."),
    ("h.layers.", "layers."),
    (".self_attn.in_proj_weight", ".attn.qkv.weight"),
    (".self_attn.in_proj_bias", ".attn.qkv.bias"),
    (".self_attn.out_proj.", ".attn.out."),
    (".linear1.", ".mlp.fc1."),
    (".linear2.", ".mlp.fc2."),
)


def _rename(key: str) -> str:
    for old, new in _RENAMES:
        if old.startswith("."):
            key = key.replace(old, new)
        elif key.startswith(old):
            key = new + key[len(old) :]
    return key
