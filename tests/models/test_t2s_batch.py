"""Continuous batching of the GPT decode (models/gpt/batch.py, t2s_numpy.step_batch): every row's logits and tokens
are exactly its decode alone with the same seed, whatever joins, leaves or waits beside it."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import load_cases_json, require_fixture

from dora_primespeech_mlx.convert.checkpoints import read_gpt
from dora_primespeech_mlx.convert.load import from_checkpoint
from dora_primespeech_mlx.models.gpt.batch import DecodeBatch
from dora_primespeech_mlx.models.gpt.decode import make_decoder
from dora_primespeech_mlx.models.gpt.generate import SamplingParams, default_noise, generate_all, start
from dora_primespeech_mlx.models.gpt.numpy_decoder import NumpyDecoder, NumpyDecodeState, step_batch
from dora_primespeech_mlx.models.kernels import half_gemv
from dora_primespeech_mlx.runtime import Runtime


@pytest.fixture(scope="module")
def gpt():
    cases = load_cases_json()
    if not cases:
        require_fixture("models/cases.json")
    return from_checkpoint(read_gpt(require_fixture("models/" + cases["checkpoints"]["gpt"])))


def _inputs(model, n: int, seed: int):
    """``n`` sentences of different lengths, with and without a prompt, from the fixture model's vocabularies."""
    rng = np.random.default_rng(seed)
    a = model.args
    out = []
    for i in range(n):
        t = 5 + 4 * i + int(rng.integers(0, 6))
        phones = rng.integers(0, a.phoneme_vocab_size, (1, t)).astype(np.int32)
        bert = (0.1 * rng.standard_normal((1, 1024, t))).astype(np.float32)
        prompt = None if i == 2 else rng.integers(0, a.eos, (1, 3 + 2 * i)).astype(np.int32)
        out.append((phones, bert, prompt))
    return out


PARAMS = SamplingParams(top_k=15, top_p=1.0, temperature=1.0, repetition_penalty=1.35)


@pytest.mark.parametrize("decode", ["numpy", "mlx"])
def test_batched_rows_equal_their_decode_alone(gpt, decode):
    decoder = make_decoder(gpt, Runtime(t2s_decode=decode))
    sentences = _inputs(gpt, 5, seed=3)
    caps = [40, 25, 33, 18, 40]  # rows stop at different steps (EOS or the cap)
    alone = [generate_all(gpt, p, b, pr, PARAMS, early_stop_num=-1, max_steps=cap, seed=100 + i, decoder=decoder)
             for i, ((p, b, pr), cap) in enumerate(zip(sentences, caps))]
    batch = DecodeBatch(max_rows=3)  # five rows, three at a time: the rest wait their turn
    joins = {0: [0], 3: [1, 2], 7: [3, 4]}  # the step after which each joins
    rows, got = {}, {i: [] for i in range(5)}
    readers = {}
    for step in range(200):
        for i in joins.get(step, []):
            p, b, pr = sentences[i]
            rows[i] = batch.add(start(gpt, p, b, pr, PARAMS, -1, max_steps=caps[i], seed=100 + i, decoder=decoder))
            readers[i] = batch.tokens(rows[i])
        # read one token of the oldest unfinished row (as a stream reads the sentence it plays); the others'
        # tokens come along and wait in their rows
        for i in sorted(readers):
            tok = next(readers[i], None)
            if tok is None:
                del readers[i]
                continue
            got[i].append(tok)
            break
        if not readers and step > max(joins):
            break
    for i, r in enumerate(alone):
        assert got[i] == r.tokens.tolist(), f"row {i}: batched tokens differ from its decode alone"
        assert rows[i].stop_reason == r.stop_reason
    if decode == "numpy" and half_gemv.kernel() is not None:
        assert batch.row_steps > batch.steps  # rows did step together


def test_step_batch_logits_are_bit_identical(gpt):
    if half_gemv.kernel() is None:
        pytest.skip(f"float16 kernels unavailable: {half_gemv.status()['why_not']}")
    dec = NumpyDecoder(gpt)
    assert dec.half
    sentences = _inputs(gpt, 5, seed=5)  # 5 rows: one pass of four and one alone; 2 and 3: a padded pass
    a = gpt.args

    def fresh():
        return [dec.prefill(p, b, np.zeros((1, 0), np.int32) if pr is None else pr, 30) for p, b, pr in sentences]

    solo, together = fresh(), fresh()
    for (s1, l1), (_s2, l2) in zip(solo, together):
        assert isinstance(s1, NumpyDecodeState) and np.array_equal(l1, l2)
    rng = np.random.default_rng(0)
    for k in range(12):
        toks = [int(t) for t in rng.integers(0, a.eos, 5)]
        pos = [k + (0 if pr is None else pr.shape[1]) for _, _, pr in sentences]
        want = [s.step(t, p) for (s, _), t, p in zip(solo, toks, pos)]
        live = [[0, 1, 2, 3, 4], [0, 2], [1, 2, 4], [0, 1, 3, 4]][k % 4]  # others sit out (fed alone)
        got = step_batch([together[i][0] for i in live], [toks[i] for i in live], [pos[i] for i in live])
        for i, g in zip(live, got):
            assert np.array_equal(g, want[i]), f"step {k} row {i}"
        for i in set(range(5)) - set(live):
            assert np.array_equal(together[i][0].step(toks[i], pos[i]), want[i])


def test_batch_limits_and_drop(gpt):
    with pytest.raises(ValueError):
        DecodeBatch(0)
    decoder = make_decoder(gpt, Runtime(t2s_decode="numpy"))
    (p, b, pr), = _inputs(gpt, 1, seed=9)
    batch = DecodeBatch(2)
    keep = batch.add(start(gpt, p, b, pr, PARAMS, -1, max_steps=20, seed=1, decoder=decoder))
    gone = batch.add(start(gpt, p, b, pr, PARAMS, -1, max_steps=20, seed=2, decoder=decoder))
    assert batch.room == 0
    it = batch.tokens(keep)
    next(it)
    batch.drop(gone)
    assert batch.room == 1 and gone.finished
    rest = list(it)
    alone = generate_all(gpt, p, b, pr, PARAMS, -1, max_steps=20, noise=default_noise(1), decoder=decoder)
    assert [*alone.tokens[:1], *rest] == alone.tokens.tolist()
