"""Half-precision weight *storage* with float32 compute (memory, not accuracy).

The released GPT-SoVITS v2 checkpoints (GPT, SoVITS, chinese-hubert-base, chinese-roberta-wwm-ext-large)
store their weights as float16, so keeping large matrices in float16 loses nothing against the source
files; it halves their memory. MLX promotes ``float32 @ float16`` to float32 (the weight is upcast on
the fly, and the product runs in float32 BLAS), and a float16 embedding row added to a float32 array is
added in float32. So a model computes exactly as before, with each large weight read as float16 and
converted per call.

The cost is the conversion: about one extra read/write of the weight per use. That is worth it for
models that run once per voice (CNHubert). The GPT and, on the CPU, RoBERTa get float16 weights with kernels
that convert in registers (``half_gemv.py``, used by ``t2s_numpy`` and ``bert_numpy``), where they are faster
than float32 too; elsewhere RoBERTa's float16 storage is opt-in (``BertModel.prepare``).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

MIN_ELEMENTS = 1 << 16  # matrices smaller than this stay float32 (biases, norms, small projections)


def half_storage(model: nn.Module, embeddings: tuple[str, ...] = (), min_elements: int | None = MIN_ELEMENTS) -> int:
    """Store the weights of every ``nn.Linear`` with at least ``min_elements`` entries, and of the
    ``nn.Embedding`` modules named in ``embeddings``, as float16. Biases stay float32. Only embeddings
    whose output is added to a float32 array (so the sum is float32) may be named. Returns the bytes
    saved (``min_elements`` None: :data:`MIN_ELEMENTS`). Idempotent."""
    if min_elements is None:
        min_elements = MIN_ELEMENTS
    saved = 0
    for name, module in model.named_modules():
        is_linear = isinstance(module, nn.Linear)
        is_emb = isinstance(module, nn.Embedding) and name in embeddings
        if not (is_linear or is_emb):
            continue
        w = module.weight
        if w.dtype != mx.float32 or w.size < min_elements:
            continue
        module.weight = w.astype(mx.float16)
        saved += w.nbytes - module.weight.nbytes
        del w
        mx.eval(module.weight)  # one at a time: a lazily loaded float32 source never coexists with the rest
    mx.eval(model.parameters())
    return saved


def parameter_bytes(model: nn.Module) -> int:
    from mlx.utils import tree_flatten

    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


def trim_heap() -> bool:
    """Give freed heap memory back to the OS (glibc ``malloc_trim``). Loading converts many numpy
    arrays into MLX arrays; the freed numpy buffers stay in the heap otherwise, about a third of the RSS after
    loading the four float32 models. Returns False where unavailable."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.malloc_trim(0))
    except (OSError, AttributeError):
        return False
