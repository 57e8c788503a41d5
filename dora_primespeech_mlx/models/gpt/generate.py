"""Decode loop and sampling for the text-to-semantic GPT (docs/model.md, "Decode loop and sampling").

With a prompt it matches ``Text2SemanticDecoder.infer_panel_batch_infer`` (what ``TTS.run`` uses) for one
sentence; without one (reference-free mode), upstream's hand-over to ``infer_panel_naive``, whose stopping rules
and repetition penalty differ: :class:`Generation` lists both. Sampling runs in numpy on the (1025,) logits row,
in float32 like torch (:func:`sample_token`). The exponential noise comes from a callable
``noise(step_idx, width) -> q`` (width 1024 for steps 0..10, 1025 after), so recorded noise can be replayed
exactly; by default it is drawn from ``numpy.random.default_rng(seed)``.

The prefix and the steps run on the model's :class:`~.t2s.Decoder` (``T2SModel.decoder``, chosen when
the model is loaded: ``decode.make_decoder``), or on one passed explicitly."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np

from .model import BERT_DIM, Decoder, T2SModel
from .numpy_decoder import NumpyDecodeState, step_batch

NoiseSource = Callable[[int, int], np.ndarray]

EOS_MASKED_STEPS = 11  # steps 0..10 cannot end the sentence
MAX_STEPS = 1500
NAIVE_REPETITION_PENALTY = 1.35  # infer_panel_naive_batched's default: what prompt-free decoding always uses


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
    stopped_at_idx: int  # the step at which decoding stopped (== len(tokens), + 1 when its token is kept)
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
    return int(np.argmax(_scores(probs, q))), int(np.argmax(penalised))


def _scores(probs: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``probs / q``, where a token of probability 0 scores 0 even when its noise is exactly 0.

    An Exp(1) draw is 0.0 about once in 10**7 float32 draws (numpy's ``standard_exponential``), i.e. in ~1 % of
    100-token sentences. Plain division then gives 0/0 = NaN, which ``argmax`` takes as the largest score: a token
    that top-k or top-p removed would be spoken. A token with probability > 0 and noise 0 scores +inf, as in
    the original (``probs_sort / q`` in torch): it is chosen, which is the limit of the exponential race."""
    with np.errstate(divide="ignore", invalid="ignore"):
        s = probs / q
    return np.where(probs > 0, s, np.float32(0))


@dataclass
class _Step:
    idx: int
    logits: np.ndarray  # raw (V,)
    token: int
    stop: str | None  # None: decoding goes on
    keep: bool  # the token is part of the result


def _as_batch(a, dtype, ndim: int, what: str) -> np.ndarray:
    arr = np.asarray(a, dtype=dtype)
    if arr.ndim == ndim - 1:
        arr = arr[None]
    if arr.ndim != ndim or arr.shape[0] != 1:
        raise ValueError(f"{what} must have batch 1 and {ndim} dims, got shape {arr.shape}")
    return arr


def _checked(model: T2SModel, phones, bert, prompt, max_steps: int, decoder: Decoder | None):
    """The inputs as batch-1 arrays and the decoder, or ValueError."""
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
    decoder = decoder if decoder is not None else model.decoder
    if decoder is None:
        raise ValueError("the GPT has no decoder: load it with convert.load.load_gpt or pass decoder=make_decoder(...)")
    return decoder, phones, bert, prompt


def _decode(model: T2SModel, phones, bert, prompt, params: SamplingParams, early_stop_num: int, max_steps: int,
            noise: NoiseSource | None, seed: int | None, decoder: Decoder | None) -> Iterator[_Step]:
    """Check the inputs now (errors surface at the call, not at the first ``next``) and return the
    step iterator; the prefill runs when iteration starts."""
    decoder, phones, bert, prompt = _checked(model, phones, bert, prompt, max_steps, decoder)
    return _loop(model, decoder, phones, bert, prompt, params, early_stop_num, max_steps, noise or default_noise(seed))


def start(model: T2SModel, phones, bert, prompt, params: SamplingParams, early_stop_num: int,
          max_steps: int = MAX_STEPS, noise: NoiseSource | None = None, seed: int | None = None,
          decoder: Decoder | None = None) -> Generation:
    """A :class:`Generation` (prefilled now) for a :class:`DecodeBatch`: the same inputs as :func:`generate`."""
    decoder, phones, bert, prompt = _checked(model, phones, bert, prompt, max_steps, decoder)
    return Generation(model, decoder, phones, bert, prompt, params, early_stop_num, max_steps,
                      noise or default_noise(seed))


def _max_new(early_stop_num: int, max_steps: int) -> int:
    """How many tokens a generation can feed at most."""
    return max_steps if early_stop_num == -1 else min(max_steps, early_stop_num + 1)


class Generation:
    """One sentence's decode, stepped from outside (what :func:`generate` iterates, and what a
    :class:`DecodeBatch` steps together with others). The prefill runs at construction; then :meth:`choose`
    samples the token of the current step from the logits at hand, and :meth:`advance` (or a batched step
    through :meth:`step_input` / :meth:`take`) computes the next step's logits.

    With a prompt, as ``infer_panel_batch_infer``:

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

    Without a prompt (Ty = 0) upstream's ``infer_panel_batch_infer`` hands over to
    ``infer_panel_naive_batched`` -> ``infer_panel_naive`` (GPT_SoVITS/AR/models/t2s_model.py), and so do we:

    - same prefill (the text alone, bidirectional), EOS masking (steps 0..10), sampling, and the k-th generated
      token fed at audio position k;
    - the repetition penalty is always :data:`NAIVE_REPETITION_PENALTY` (1.35): the hand-over does not pass the
      caller's value on, so ``infer_panel_naive_batched``'s default applies; it covers the generated tokens;
    - EOS (sampled, or the argmax of the penalised logits) stops and is dropped, as above;
    - an early stop (more than ``early_stop_num`` tokens) and the step cap (step ``max_steps - 1``) **keep** the
      token of the stopping step: ``early_stop_num + 1`` or ``max_steps`` tokens. Upstream returns idx 0 there
      and the pipeline keeps ``y[-0:]``, every generated token. (Its ``[0]`` fallback for an empty ``y`` cannot
      trigger: a stop that drops its token is an EOS, which steps 0..10 exclude.)"""

    def __init__(self, model: T2SModel, decoder: Decoder, phones: np.ndarray, bert: np.ndarray, prompt: np.ndarray,
                 params: SamplingParams, early_stop_num: int, max_steps: int, noise: NoiseSource):
        self.eos = model.args.eos
        self.seen = np.zeros(model.args.vocab_size, dtype=bool)
        self.seen[prompt[0]] = True
        self.n_prompt = prompt.shape[1]
        self.prompt_free = self.n_prompt == 0  # upstream's infer_panel_naive (class docstring)
        if self.prompt_free:
            params = replace(params, repetition_penalty=NAIVE_REPETITION_PENALTY)
        self.params, self.early_stop_num, self.max_steps, self.noise = params, early_stop_num, max_steps, noise
        self.session, self.raw = decoder.prefill(phones, bert, prompt, _max_new(early_stop_num, max_steps))
        self.idx = 0
        self.last: _Step | None = None  # the step :meth:`choose` made last

    @property
    def stopped(self) -> bool:
        return self.last is not None and self.last.stop is not None

    def choose(self) -> _Step:
        """The token of step ``idx`` from the current logits (and whether decoding stops there)."""
        idx, raw = self.idx, self.raw
        row = raw[: self.eos] if idx < EOS_MASKED_STEPS else raw
        token, greedy = sample_token(row, self.seen, self.params, self.noise(idx, row.shape[0]))
        stop = None
        if token == self.eos or greedy == self.eos:
            stop = "eos"
        elif self.early_stop_num != -1 and idx + 1 > self.early_stop_num:
            stop = "early_stop"
        elif idx == self.max_steps - 1:
            stop = "max_steps"
        self.last = _Step(idx, raw, token, stop, keep=stop is None or (self.prompt_free and stop != "eos"))
        if stop is None:
            self.seen[token] = True
        return self.last

    def step_input(self) -> tuple[int, int]:
        """(token, audio position) the next step feeds: the k-th generated token (k = idx) goes at Ty + k."""
        return self.last.token, self.n_prompt + self.idx

    def take(self, raw: np.ndarray) -> None:
        """The logits of the step after the chosen token (computed alone or in a batch)."""
        self.raw = raw
        self.idx += 1

    def advance(self) -> None:
        """Compute the next step's logits alone."""
        self.take(self.session.step(*self.step_input()))


def step_together(gens: list[Generation]) -> None:
    """Advance every generation by one step; numpy sessions of one model share one batched step
    (:func:`~.numpy_decoder.step_batch`: each weight read once for all rows, every row's logits as alone)."""
    if len(gens) > 1 and all(isinstance(g.session, NumpyDecodeState) for g in gens):
        inputs = [g.step_input() for g in gens]
        raws = step_batch([g.session for g in gens], [t for t, _ in inputs], [p for _, p in inputs])
        for g, raw in zip(gens, raws):
            g.take(raw)
        return
    for g in gens:
        g.advance()


def _loop(
    model: T2SModel,
    decoder: Decoder,
    phones: np.ndarray,
    bert: np.ndarray,
    prompt: np.ndarray,
    params: SamplingParams,
    early_stop_num: int,
    max_steps: int,
    noise: NoiseSource,
) -> Iterator[_Step]:
    g = Generation(model, decoder, phones, bert, prompt, params, early_stop_num, max_steps, noise)
    while True:
        step = g.choose()
        yield step
        if step.stop:
            return
        g.advance()


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
    decoder: Decoder | None = None,
) -> Iterator[int]:
    """Yield semantic tokens as soon as they are chosen. ``phones`` (1, Tx) ids, ``bert`` (1, 1024, Tx),
    ``prompt`` (1, Ty) semantic tokens or None; ``early_stop_num`` is ``T2SArgs.early_stop_num`` in the
    pipeline (-1 = off). Stop iterating to cancel. ``decoder`` runs the steps (default: ``model.decoder``)."""
    steps = _decode(model, phones, bert, prompt, params, early_stop_num, max_steps, noise, seed, decoder)
    return (s.token for s in steps if s.keep)


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
    return_logits: bool = False,
    progress: bool = False,
    decoder: Decoder | None = None,
) -> GenerationResult:
    """Run the whole decode; optionally keep every step's raw logits (tests) and show tqdm progress."""
    steps = _decode(model, phones, bert, prompt, params, early_stop_num, max_steps, noise, seed, decoder)
    if progress:
        from tqdm import tqdm

        steps = tqdm(steps, total=_max_new(early_stop_num, max_steps), desc="GPT", unit="tok")
    tokens: list[int] = []
    logits: list[np.ndarray] = []
    last = None
    for s in steps:
        last = s
        if return_logits:
            logits.append(s.logits)
        if s.keep:
            tokens.append(s.token)
    assert last is not None and last.stop is not None
    return GenerationResult(
        tokens=np.asarray(tokens, dtype=np.int64),
        stopped_at_idx=last.idx,
        stop_reason=last.stop,
        step_logits=np.stack(logits) if return_logits else None,
    )
