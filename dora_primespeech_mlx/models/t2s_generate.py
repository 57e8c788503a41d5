"""Decode loop and sampling for the text-to-semantic GPT (gpt-sovits-v2.md sections 5.6-5.8).

Matches ``Text2SemanticDecoder.infer_panel_batch_infer`` (what ``TTS.run`` uses) for one sentence:

- step ``idx`` computes raw logits (1025); for idx 0..10 the EOS column is dropped;
- the token is chosen by :func:`sample_token` (repetition penalty over the distinct previous tokens,
  prompt included -> top-p if < 1 -> temperature -> top-k with ties kept -> softmax ->
  ``argmax(probs / q)``, ``q ~ Exp(1)``);
- the loop stops when the sampled token or the argmax of the penalised logits is EOS, when more than
  ``early_stop_num`` tokens exist (``-1`` disables it), or at step ``max_steps - 1``; in every case the
  token of the stopping step is dropped. So the result holds exactly ``stopped_at_idx`` tokens: the
  tokens before EOS, exactly ``early_stop_num`` tokens, or ``max_steps - 1`` (1499) tokens.

Result when nothing is kept: EOS cannot be chosen in steps 0..10, so an empty result only happens with
``early_stop_num == 0`` (or ``max_steps == 1``). We then return no tokens. (Upstream's pipeline slices
``y[-0:]`` there and would hand back the prompt itself; its ``[0]`` fallback only applies to an empty
``y``, which cannot happen with a prompt.) The engine decides what to do with an empty result.

The same stop rules are applied without a prompt (Ty = 0); upstream sends reference-free requests to
its naive loop, which keeps one extra token on an early stop.

Sampling runs in numpy on the (1025,) logits row, in float32 like torch. The exponential noise comes
from a callable ``noise(step_idx, width) -> q`` (width 1024 for steps 0..10, 1025 after), so recorded
noise can be replayed exactly; by default it is drawn from ``numpy.random.default_rng(seed)``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from .t2s import BERT_DIM, T2SModel

NoiseSource = Callable[[int, int], np.ndarray]

EOS_MASKED_STEPS = 11  # steps 0..10 cannot end the sentence
MAX_STEPS = 1500
CACHE_STEP = 256
DECODE_BACKENDS = ("auto", "mlx", "numpy")


def decode_backend(override: str | None = None) -> str:
    """Which implementation runs the one-token decode steps: ``"numpy"`` (``t2s_numpy``: gemv, about
    twice as fast as MLX's M=1 sgemm on the CPU) when MLX computes on the CPU, ``"mlx"`` otherwise
    (Metal/CUDA). ``override`` or ``PRIMESPEECH_T2S_DECODE`` (auto | mlx | numpy) forces one."""
    choice = (override or os.environ.get("PRIMESPEECH_T2S_DECODE", "auto")).strip().lower() or "auto"
    if choice not in DECODE_BACKENDS:
        raise ValueError(f"GPT decode backend {choice!r}: expected one of {', '.join(DECODE_BACKENDS)}")
    if choice == "auto":
        return "numpy" if mx.default_device().type == mx.cpu else "mlx"
    return choice


def compile_decode() -> bool:
    """Whether the MLX decode step runs under ``mx.compile`` (``T2SModel.compiled_decode``): on by
    default off the CPU (GPUs), where the eager step is launch-bound; ``PRIMESPEECH_T2S_COMPILE``
    (0/1) overrides."""
    value = os.environ.get("PRIMESPEECH_T2S_COMPILE", "").strip().lower()
    if value:
        return value in ("1", "true", "yes", "on")
    return mx.default_device().type != mx.cpu


def warmup(model: T2SModel, prefix_rows: int = 256, cache_step: int = CACHE_STEP) -> None:
    """Build what the first request would otherwise pay for: the numpy views (CPU) or the compiled
    decode step of the first KV buckets (MLX). Call at node start; takes ~0.1 s on the CPU path and
    one trace per bucket on the compiled path."""
    backend = decode_backend()
    if backend == "numpy":
        from .t2s_numpy import NumpyDecoder

        NumpyDecoder.for_model(model)
        return
    if not compile_decode():
        return
    for rows in range(cache_step, prefix_rows + 2 * cache_step, cache_step):
        cache = KVCache.for_model(model, cache_step)
        cache.reserve(rows)
        cache.offset = rows - 1
        mx.eval(model.step(0, 0, cache, compiled=True))


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

    @classmethod
    def for_model(cls, model: T2SModel, step: int = CACHE_STEP) -> KVCache:
        a = model.args
        return cls(a.num_layers, a.num_heads, a.head_dim, step)

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


@dataclass(frozen=True)
class SamplingParams:
    """``top_k`` None or <= 0 disables top-k; ``top_p`` >= 1 disables top-p (TTS.run: 15, 1, 1, 1.35)."""

    top_k: int | None = 15
    top_p: float = 1.0
    temperature: float = 1.0
    repetition_penalty: float = 1.35


@dataclass
class GenerationResult:
    tokens: np.ndarray  # (n,) int64 semantic tokens, prompt excluded
    stopped_at_idx: int  # the step at which decoding stopped (== len(tokens))
    stop_reason: str  # "eos" | "early_stop" | "max_steps"
    step_logits: np.ndarray | None = None  # (stopped_at_idx + 1, V) raw logits when requested


def default_noise(seed: int | None = None) -> NoiseSource:
    """Exp(1) noise from a seeded numpy Generator."""
    rng = np.random.default_rng(seed)
    return lambda step, width: rng.standard_exponential(width, dtype=np.float32)


def apply_repetition_penalty(logits: np.ndarray, seen: np.ndarray, penalty: float) -> np.ndarray:
    """``l < 0 -> l * rp``, else ``l / rp`` on the tokens flagged in ``seen`` (once per distinct token)."""
    out = np.array(logits, dtype=np.float32, copy=True)
    if penalty == 1.0:
        return out
    idx = np.flatnonzero(seen[: out.shape[0]])
    score = out[idx]
    rp = np.float32(penalty)
    out[idx] = np.where(score < 0, score * rp, score / rp)
    return out


def logits_to_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """top-p (only if < 1) -> temperature -> top-k (ties kept) -> softmax, on already penalised logits."""
    x = np.asarray(logits, dtype=np.float32)
    if params.top_p is not None and params.top_p < 1.0:
        order = np.argsort(-x, kind="stable")
        cum = np.cumsum(_softmax(x[order]).astype(np.float64)).astype(np.float32)  # torch: double acc
        remove = cum > np.float32(params.top_p)
        remove[0] = False
        x = x.copy()
        x[order[remove]] = -np.inf
    x = x / np.float32(max(params.temperature, 1e-5))
    if params.top_k is not None and params.top_k > 0:
        k = min(int(params.top_k), x.shape[0])
        pivot = np.partition(x, x.shape[0] - k)[x.shape[0] - k]
        x = np.where(x < pivot, np.float32(-np.inf), x)
    return _softmax(x)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return (e / e.sum(dtype=np.float32)).astype(np.float32)


def sample_token(logits: np.ndarray, seen: np.ndarray, params: SamplingParams, q: np.ndarray) -> tuple[int, int]:
    """Choose a token from one row of logits. ``seen`` flags the previous tokens (prompt included),
    ``q`` is the Exp(1) noise of this row. Returns (token, argmax of the penalised logits)."""
    penalised = apply_repetition_penalty(logits, seen, params.repetition_penalty)
    probs = logits_to_probs(penalised, params)
    q = np.asarray(q, dtype=np.float32)
    if q.shape != probs.shape:
        raise ValueError(f"noise has shape {q.shape}, expected {probs.shape}")
    return int(np.argmax(probs / q)), int(np.argmax(penalised))


@dataclass
class _Step:
    idx: int
    logits: np.ndarray  # raw (V,)
    token: int
    stop: str | None  # None: the token is kept


def _as_batch(a, dtype, ndim: int, what: str) -> np.ndarray:
    arr = np.asarray(a, dtype=dtype)
    if arr.ndim == ndim - 1:
        arr = arr[None]
    if arr.ndim != ndim or arr.shape[0] != 1:
        raise ValueError(f"{what} must have batch 1 and {ndim} dims, got shape {arr.shape}")
    return arr


def _decode(
    model: T2SModel,
    phones,
    bert,
    prompt,
    params: SamplingParams,
    early_stop_num: int,
    max_steps: int,
    noise: NoiseSource | None,
    seed: int | None,
    cache_step: int,
    backend: str | None = None,
) -> Iterator[_Step]:
    """Check the inputs now (errors surface at the call, not at the first ``next``) and return the
    step iterator; the prefill runs when iteration starts."""
    a = model.args
    phones = _as_batch(phones, np.int32, 2, "phones")
    bert = _as_batch(bert, np.float32, 3, "bert features")
    prompt = _as_batch(np.zeros((0,)) if prompt is None else prompt, np.int32, 2, "prompt")
    if phones.shape[1] == 0:
        raise ValueError("phones is empty")
    if phones.min() < 0 or phones.max() >= a.phoneme_vocab_size:
        raise ValueError(f"phone ids must be in [0, {a.phoneme_vocab_size}), got {phones.min()}..{phones.max()}")
    if bert.shape[1:] != (BERT_DIM, phones.shape[1]):
        raise ValueError(f"bert features must be (1, {BERT_DIM}, {phones.shape[1]}) for the phones, got {bert.shape}")
    if prompt.size and (prompt.min() < 0 or prompt.max() >= a.eos):
        raise ValueError(f"prompt semantic tokens must be in [0, {a.eos}), got {prompt.min()}..{prompt.max()}")
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    backend = decode_backend(backend)
    return _loop(
        model, phones, bert, prompt, params, early_stop_num, max_steps, noise or default_noise(seed), cache_step,
        backend,
    )


def _loop(
    model: T2SModel,
    phones: np.ndarray,
    bert: np.ndarray,
    prompt: np.ndarray,
    params: SamplingParams,
    early_stop_num: int,
    max_steps: int,
    noise: NoiseSource,
    cache_step: int,
    backend: str,
) -> Iterator[_Step]:
    eos = model.args.eos
    seen = np.zeros(model.args.vocab_size, dtype=bool)
    seen[prompt[0]] = True
    n_prompt = prompt.shape[1]

    if backend == "numpy":
        from .t2s_numpy import NumpyDecoder

        n_new = max_steps if early_stop_num == -1 else min(max_steps, early_stop_num + 1)
        state, raw = NumpyDecoder.for_model(model).prefill(
            model, mx.array(phones), mx.array(bert), mx.array(prompt), n_new
        )

        def next_logits(token: int, position: int) -> np.ndarray:
            return state.step(token, position)
    else:
        cache = KVCache.for_model(model, cache_step)
        logits = model.prefill(mx.array(phones), mx.array(bert), mx.array(prompt), cache)
        raw = np.array(logits[0], dtype=np.float32)

        compiled = compile_decode()

        def next_logits(token: int, position: int) -> np.ndarray:
            return np.array(model.step(token, position, cache, compiled=compiled)[0], dtype=np.float32)

    for idx in range(max_steps):
        row = raw[:eos] if idx < EOS_MASKED_STEPS else raw
        token, greedy = sample_token(row, seen, params, noise(idx, row.shape[0]))
        stop = None
        if token == eos or greedy == eos:
            stop = "eos"
        elif early_stop_num != -1 and idx + 1 > early_stop_num:
            stop = "early_stop"
        elif idx == max_steps - 1:
            stop = "max_steps"
        yield _Step(idx, raw, token, stop)
        if stop:
            return
        seen[token] = True
        # the k-th generated token (k = idx) is fed at audio position Ty + k
        raw = next_logits(token, n_prompt + idx)


def generate(
    model: T2SModel,
    phones,
    bert,
    prompt,
    params: SamplingParams,
    early_stop_num: int,
    max_steps: int = MAX_STEPS,
    noise: NoiseSource | None = None,
    seed: int | None = None,
    cache_step: int = CACHE_STEP,
    backend: str | None = None,
) -> Iterator[int]:
    """Yield semantic tokens as soon as they are chosen. ``phones`` (1, Tx) ids, ``bert`` (1, 1024, Tx),
    ``prompt`` (1, Ty) semantic tokens or None; ``early_stop_num`` is ``T2SArgs.early_stop_num`` in the
    pipeline (-1 = off). Stop iterating to cancel. ``backend`` picks the decode-step implementation
    (:func:`decode_backend`; default: numpy on the CPU, MLX on a GPU)."""
    steps = _decode(model, phones, bert, prompt, params, early_stop_num, max_steps, noise, seed, cache_step, backend)
    return (s.token for s in steps if s.stop is None)


def generate_all(
    model: T2SModel,
    phones,
    bert,
    prompt,
    params: SamplingParams,
    early_stop_num: int,
    max_steps: int = MAX_STEPS,
    noise: NoiseSource | None = None,
    seed: int | None = None,
    cache_step: int = CACHE_STEP,
    return_logits: bool = False,
    progress: bool = False,
    backend: str | None = None,
) -> GenerationResult:
    """Run the whole decode; optionally keep every step's raw logits (tests) and show tqdm progress."""
    steps = _decode(model, phones, bert, prompt, params, early_stop_num, max_steps, noise, seed, cache_step, backend)
    if progress:
        from tqdm import tqdm

        steps = tqdm(
            steps,
            total=max_steps if early_stop_num == -1 else min(max_steps, early_stop_num + 1),
            desc="GPT",
            unit="tok",
        )
    tokens: list[int] = []
    logits: list[np.ndarray] = []
    last = None
    for s in steps:
        last = s
        if return_logits:
            logits.append(s.logits)
        if s.stop is None:
            tokens.append(s.token)
    assert last is not None and last.stop is not None
    return GenerationResult(
        tokens=np.asarray(tokens, dtype=np.int64),
        stopped_at_idx=last.idx,
        stop_reason=last.stop,
        step_logits=np.stack(logits) if return_logits else None,
    )
