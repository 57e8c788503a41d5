"""The converted-model loader reads weights lean (one tensor at a time into MLX) and still loads
exactly what was written, strictly (a missing or misshapen tensor fails with a clear error)."""

from __future__ import annotations  # noqa: I001  (the package must load before mlx)

import dataclasses
import json

import dora_primespeech_mlx  # noqa: F401  (BLAS set-up before mlx)
import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from dora_primespeech_mlx.convert import load
from dora_primespeech_mlx.convert.torch_pickle import CheckpointError
from dora_primespeech_mlx.models.bert.model import BertArgs, BertModel

ARGS = BertArgs(vocab_size=50, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                intermediate_size=64, max_position_embeddings=16)


def _write(tmp_path, weights: dict[str, np.ndarray]):
    from safetensors.numpy import save_file

    save_file(weights, str(tmp_path / "model.safetensors"))
    meta = {"format_version": load.FORMAT_VERSION, "kind": "bert", "version": None,
            "args": dataclasses.asdict(ARGS), "source": "test"}
    (tmp_path / "config.json").write_text(json.dumps(meta))
    return tmp_path


def _weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = {k: v.shape for k, v in tree_flatten(BertModel(ARGS).parameters())}
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def test_converted_folder_loads_every_tensor_exactly(tmp_path):
    weights = _weights()
    model = load.load(_write(tmp_path, weights), "bert")
    got = dict(tree_flatten(model.parameters()))
    assert set(got) == set(weights) and any(k.startswith("layers.1.") for k in got)
    for k, v in weights.items():
        np.testing.assert_array_equal(np.array(got[k]), v, err_msg=k)


def test_build_consumes_a_weight_dict(tmp_path):
    weights = _weights(1)
    expected = {k: v.copy() for k, v in weights.items()}
    model = load._build("bert", ARGS, weights)
    assert weights == {}  # every numpy source was dropped once copied
    got = dict(tree_flatten(model.parameters()))
    for k, v in expected.items():
        np.testing.assert_array_equal(np.array(got[k]), v, err_msg=k)


def test_missing_tensor_is_an_error(tmp_path):
    weights = _weights()
    weights.pop(sorted(weights)[0])
    with pytest.raises(ValueError, match="Missing"):
        load.load(_write(tmp_path, weights), "bert")


def test_corrupt_file_names_the_file(tmp_path):
    _write(tmp_path, _weights())
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load.load(tmp_path, "bert")


def test_half_storage_of_lazily_loaded_weights_matches(tmp_path):
    from dora_primespeech_mlx.models.shared.storage import half_storage

    weights = _weights(2)
    model = BertModel(ARGS)
    model.load_weights(list(mx.load(str(_write(tmp_path, weights) / "model.safetensors")).items()))
    half_storage(model, min_elements=1)
    got = dict(tree_flatten(model.parameters()))
    key = "layers.0.ffn.up.weight"
    assert got[key].dtype == mx.float16
    np.testing.assert_array_equal(np.array(got[key]), weights[key].astype(np.float16))
    assert got["layers.0.ffn.up.bias"].dtype == mx.float32  # biases stay float32
