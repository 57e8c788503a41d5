"""Chinese RoBERTa features in MLX against the PyTorch goldens: every ``bert*`` case of models/cases.json
(tokenizer ids, the hidden states of the layers run, char and phone features), with the tolerances
recorded there; batched == unbatched."""

from __future__ import annotations

import functools
import shutil

import mlx.core as mx
import numpy as np
import pytest
from conftest import model_cases, param_or_missing, require_case, require_fixture

from dora_primespeech_mlx.convert.checkpoints import read_hf_dir
from dora_primespeech_mlx.convert.load import load_bert
from dora_primespeech_mlx.models.bert.model import (
    BertArgs,
    BertModel,
    BertTokenizer,
    bert_features,
    bert_features_batch,
    phone_features,
)
from dora_primespeech_mlx.runtime import Runtime

CASES_JSON = "models/cases.json"
BERT_CASES = model_cases("bert")


@functools.lru_cache(maxsize=4)
def _load(model_dir: str, half: bool | None = None) -> tuple[BertModel, BertTokenizer]:
    return load_bert(model_dir, cache=False, runtime=Runtime(bert_half=half))


def _load_for(rel: str, half: bool | None = None) -> tuple[BertModel, BertTokenizer]:
    """The model as loaded by default (``half`` None: float16 numpy kernels where available, see
    models/bert/numpy_encoder.py) or with float32 MLX (``half`` False)."""
    return _load(str(require_fixture(f"models/{rel}")), half)


def _assert_close(name: str, got, want: np.ndarray, tol: dict) -> float:
    got = np.asarray(got, dtype=np.float32)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != golden {want.shape}"
    err = float(np.abs(got - want).max()) if want.size else 0.0
    np.testing.assert_allclose(
        got, want, atol=tol.get("atol", 0.0), rtol=tol.get("rtol", 0.0), err_msg=f"{name} (max abs err {err:.3g})"
    )
    return err


def _case_data(case):
    gold = np.load(require_fixture(f"models/{case['file']}"))
    return gold, case["norm_text"], [int(n) for n in gold["word2ph"]]


@pytest.mark.parametrize("half", [None, False], ids=["default", "float32-mlx"])
@pytest.mark.parametrize("case", param_or_missing(BERT_CASES, lambda c: c["name"], "bert cases"))
def test_bert_matches_golden(case, half):
    case = require_case(case, CASES_JSON)
    model, tok = _load_for(case["model"], half)
    gold, norm_text, word2ph = _case_data(case)
    tol = case["tolerance"]
    tol_hidden = tol.get("hidden_states", tol["phone_features"])

    ids = tok.encode(norm_text)
    assert ids == gold["input_ids"][0].tolist()

    input_ids = mx.array(gold["input_ids"].astype(np.int32))
    hidden = model(input_ids, output_hidden_states=True)
    n_run = model.args.num_layers_run
    assert len(hidden) == n_run + 1 == gold["hidden_states"].shape[0] - 2
    hs = np.stack([np.asarray(h[0]) for h in hidden])
    _assert_close("hidden_states[:-2]", hs, gold["hidden_states"][: n_run + 1], tol_hidden)

    feats = model(input_ids, mx.array(gold["attention_mask"].astype(np.int32)))
    np.testing.assert_array_equal(np.asarray(feats), np.asarray(hidden[-1]))
    char = np.asarray(feats[0, 1:-1])
    _assert_close("char_features", char, gold["char_features"], tol_hidden)
    _assert_close("phone_features(golden chars)", phone_features(gold["char_features"], word2ph),
                  gold["phone_features"], tol["phone_features"])
    _assert_close("bert_features", bert_features(model, tok, norm_text, word2ph), gold["phone_features"],
                  tol["phone_features"])


@pytest.mark.parametrize("case", param_or_missing(BERT_CASES, lambda c: c["name"], "bert cases"))
def test_tokenizer_from_vocab_txt_matches(case, tmp_path):
    """Without tokenizer.json the WordPiece tokenizer is rebuilt from vocab.txt: same ids."""
    case = require_case(case, CASES_JSON)
    src = require_fixture(f"models/{case['model']}")
    if not (src / "vocab.txt").is_file():
        pytest.skip(f"{src} has no vocab.txt")
    for f in src.iterdir():
        if f.name != "tokenizer.json" and f.name.endswith((".txt", ".json")):
            shutil.copy(f, tmp_path / f.name)
    tok = BertTokenizer.from_dir(tmp_path)
    gold, norm_text, _ = _case_data(case)
    assert tok.encode(norm_text) == gold["input_ids"][0].tolist()


@pytest.mark.parametrize("half", [None, False], ids=["default", "float32-mlx"])
def test_batched_equals_unbatched(half):
    cases = [require_case(c, CASES_JSON) for c in BERT_CASES] or [require_case(None, CASES_JSON)]
    by_model: dict[str, list] = {}
    for c in cases:
        by_model.setdefault(c["model"], []).append(c)
    for rel, group in by_model.items():
        model, tok = _load_for(rel, half)
        data = [_case_data(c) for c in group]
        # reversed order and a repeat, so rows of different lengths are padded differently
        items = [(t, w) for _, t, w in data] + [(t, w) for _, t, w in reversed(data)]
        golds = [g for g, _, _ in data] + [g for g, _, _ in reversed(data)]
        cs = group + list(reversed(group))
        batched = bert_features_batch(model, tok, items)
        assert len(batched) == len(items)
        for (text, w2p), got, gold, c in zip(items, batched, golds, cs):
            single = bert_features(model, tok, text, w2p)
            np.testing.assert_allclose(got, single, atol=1e-5, rtol=0, err_msg=f"{c['name']} batched")
            _assert_close(f"{c['name']} batched", got, gold["phone_features"], c["tolerance"]["phone_features"])
    assert bert_features_batch(model, tok, []) == []


def test_word2ph_mismatch_is_a_clear_error():
    case = require_case(BERT_CASES[0] if BERT_CASES else None, CASES_JSON)
    model, tok = _load_for(case["model"])
    _, norm_text, word2ph = _case_data(case)
    with pytest.raises(ValueError, match="len\\(word2ph\\)"):
        bert_features(model, tok, norm_text, word2ph[:-1])
    with pytest.raises(ValueError, match="len\\(word2ph\\)"):
        bert_features_batch(model, tok, [(norm_text, word2ph), (norm_text + ",", word2ph)])


def test_phone_features_repeats_rows():
    chars = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = phone_features(chars, [2, 0, 3])
    assert out.shape == (4, 5)
    np.testing.assert_array_equal(out.T, chars[[0, 0, 2, 2, 2]])
    with pytest.raises(ValueError, match="only 3 character tokens"):
        phone_features(chars, [1, 1, 1, 1])


def test_sanitize_keeps_only_needed_layers():
    case = require_case(BERT_CASES[0] if BERT_CASES else None, CASES_JSON)
    raw = read_hf_dir(require_fixture(f"models/{case['model']}"), "bert")
    args = BertArgs.from_config(raw.config)
    w = BertModel.sanitize(raw.weights)
    assert not any(k.startswith(("cls.", "pooler.", "bert.", "encoder.")) for k in w)
    layers = {int(k.split(".")[1]) for k in w if k.startswith("layers.")}
    assert layers == set(range(args.num_hidden_layers - 2))
    assert all(v.dtype == np.float32 for v in w.values())


def test_too_many_tokens_is_a_clear_error():
    args = BertArgs(vocab_size=10, hidden_size=8, num_hidden_layers=3, num_attention_heads=2,
                    intermediate_size=16, max_position_embeddings=6)
    model = BertModel(args)
    assert np.asarray(model(mx.zeros((1, 6), dtype=mx.int32))).shape == (1, 6, 8)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(mx.zeros((1, 7), dtype=mx.int32))
