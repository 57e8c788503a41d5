"""The KV cache the text-to-semantic GPT (:mod:`.t2s`) fills: per-layer keys and values, preallocated in
buckets so a decode step's array shapes only change when the cache grows (what ``mx.compile`` needs)."""

from __future__ import annotations

import mlx.core as mx

CACHE_STEP = 256  # rows added each time the cache grows


class KVCache:
    """Preallocated keys/values of every layer, (1, heads, capacity, head_dim) each, written in place
    by slice updates. The capacity grows in multiples of ``step`` rows, so the decode step's shapes stay
    the same within a bucket; ``offset`` is the number of filled rows."""

    def __init__(self, num_layers: int, num_heads: int, head_dim: int, step: int = CACHE_STEP):
        if step < 1:
            raise ValueError(f"KV cache step must be >= 1, got {step}")
        self.num_heads, self.head_dim, self.step = num_heads, head_dim, step
        self.keys: list[mx.array] = [mx.zeros((1, num_heads, 0, head_dim)) for _ in range(num_layers)]
        self.values: list[mx.array] = [mx.zeros((1, num_heads, 0, head_dim)) for _ in range(num_layers)]
        self.offset = 0

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def reserve(self, rows: int) -> None:
        """Make room for ``rows`` rows in total (grows to the next multiple of ``step``)."""
        if rows <= self.capacity:
            return
        extra = -(-rows // self.step) * self.step - self.capacity
        pad = mx.zeros((1, self.num_heads, extra, self.head_dim))
        self.keys = [mx.concatenate([k, pad], axis=2) for k in self.keys]
        self.values = [mx.concatenate([v, pad], axis=2) for v in self.values]
