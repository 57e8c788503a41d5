"""float16 weight storage (models/shared/storage.py) changes memory, not results.

The fixture checkpoints hold float16 weights like the released ones, so storing them as float16
again is exact and a half-storage model must give the float32 model's outputs (float32 compute).
The thresholds are forced to 0 so every Linear of the tiny fixture models is converted.
"""

from __future__ import annotations  # noqa: I001  (the package must load before mlx)

import dora_primespeech_mlx  # noqa: F401  (preloads a fast BLAS)
import mlx.core as mx
import numpy as np
from conftest import require_fixture

from dora_primespeech_mlx.convert.checkpoints import read_hf_dir
from dora_primespeech_mlx.models.bert.model import BertArgs, BertModel
from dora_primespeech_mlx.models.hubert.model import HubertArgs, HubertModel
from dora_primespeech_mlx.models.shared.storage import half_storage, parameter_bytes


def _fp32(kind, args_cls, model_cls, rel):
    raw = read_hf_dir(require_fixture(rel), kind)
    model = model_cls(args_cls.from_config(raw.config))
    model.load_weights([(k, mx.array(v)) for k, v in model_cls.sanitize(raw.weights).items()], strict=True)
    mx.eval(model.parameters())
    return model, raw


def test_bert_half_storage_is_exact():
    model, raw = _fp32("bert", BertArgs, BertModel, "models/chinese-roberta-tiny")
    ids = mx.array(np.random.default_rng(0).integers(5, model.args.vocab_size, (2, 11)).astype(np.int32))
    mask = mx.array(np.array([[1] * 11, [1] * 7 + [0] * 4], dtype=np.int32))
    want = np.array(model(ids, mask))
    before = parameter_bytes(model)
    saved = half_storage(model, embeddings=("embeddings.word_embeddings",), min_elements=0)
    assert saved > 0 and parameter_bytes(model) == before - saved
    # every layer the model runs (hidden_states[-3]: num_hidden_layers - 2 of them, none for a 2-layer BERT)
    for layer in model.layers:
        assert layer.ffn.up.weight.dtype == mx.float16
        assert layer.ffn.up.bias.dtype == mx.float32
    assert model.embeddings.word_embeddings.weight.dtype == mx.float16
    assert model.embeddings.position_embeddings.weight.dtype == mx.float32
    got = model(ids, mask)
    assert got.dtype == mx.float32
    np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-5)
    assert half_storage(model, min_elements=0) == 0  # idempotent


def test_hubert_half_storage_is_exact():
    model, _ = _fp32("hubert", HubertArgs, HubertModel, "models/chinese-hubert-tiny")
    wav = mx.array(np.random.default_rng(1).uniform(-0.5, 0.5, (1, 8000)).astype(np.float32))
    want = np.array(model(wav))
    assert half_storage(model, min_elements=0) > 0
    got = model(wav)
    assert got.dtype == mx.float32
    np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-5)


def test_loader_prepare_keeps_float32_compute():
    model, _ = _fp32("bert", BertArgs, BertModel, "models/chinese-roberta-tiny")
    model.prepare()
    ids = mx.array([[2, 7, 9, 3]], dtype=mx.int32)
    assert model(ids).dtype == mx.float32
