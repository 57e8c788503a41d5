"""Torch-free checkpoint reading, version detection, clear errors, and conversion round trips."""

from __future__ import annotations

import io
import pickle
import sys
import zipfile

import numpy as np
import pytest

from dora_primespeech_mlx.convert import load as L
from dora_primespeech_mlx.convert.checkpoints import read_gpt, read_hf_dir, read_sovits
from dora_primespeech_mlx.convert.torch_pickle import CheckpointError, load_torch_file
from tests.conftest import load_cases_json, require_fixture


def _ckpt(kind: str):
    cases = load_cases_json()
    rel = cases.get("checkpoints", {}).get(kind)
    if rel is None:
        require_fixture("models/cases.json")
    return require_fixture(f"models/{rel}")


def test_no_torch_imported():
    read_gpt(_ckpt("gpt"))
    read_sovits(_ckpt("sovits"))
    assert "torch" not in sys.modules


def test_gpt_reads_fp16_weights_and_config():
    raw = read_gpt(_ckpt("gpt"))
    cfg = load_cases_json()["gpt_config_model"]
    assert raw.version == "v2"
    emb = raw.weights["model.ar_text_embedding.word_embeddings.weight"]
    assert emb.dtype == np.float16
    assert emb.shape == (cfg["phoneme_vocab_size"], cfg["embedding_dim"])
    assert raw.config["model"]["n_layer"] == cfg["n_layer"]
    assert raw.config["data"]["max_sec"] == load_cases_json()["gpt_config_data_max_sec"]


def test_sovits_reads_and_detects_v2():
    raw = read_sovits(_ckpt("sovits"))
    assert raw.version == "v2"
    assert raw.weights["enc_p.text_embedding.weight"].shape[0] == 732
    assert raw.config["model"]["upsample_rates"] == load_cases_json()["sovits_config_model"]["upsample_rates"]


@pytest.mark.parametrize("tag,version", [(b"02", "v3"), (b"03", "v3"), (b"04", "v4")])
def test_sovits_version_tags_refused_clearly(tmp_path, tag, version):
    data = bytearray(_ckpt("sovits").read_bytes())
    data[:2] = tag
    path = tmp_path / "tagged.pth"
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"{version}.*not supported yet") as exc:
        read_sovits(path)
    assert str(path) in str(exc.value)


@pytest.mark.parametrize("tag,version", [(b"05", "v2Pro"), (b"06", "v2ProPlus")])
def test_v2pro_tag_on_v2_weights_is_a_clear_error(tmp_path, tag, version):
    """A v2Pro-family tag needs the speaker-verification layers; v2 weights under that tag are refused
    by name (upstream would fail later, at decode, on a shape mismatch)."""
    data = bytearray(_ckpt("sovits").read_bytes())
    data[:2] = tag
    path = tmp_path / "tagged.pth"
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"tagged {version} but lacks") as exc:
        read_sovits(path)
    assert str(path) in str(exc.value)


def test_sovits_v2_tag_is_read(tmp_path):
    data = bytearray(_ckpt("sovits").read_bytes())
    data[:2] = b"01"
    path = tmp_path / "tagged.pth"
    path.write_bytes(bytes(data))
    assert read_sovits(path).version == "v2"


def test_wrong_kind_named(tmp_path):
    with pytest.raises(CheckpointError, match="SoVITS"):
        read_gpt(_ckpt("sovits"))
    with pytest.raises(CheckpointError, match="GPT"):
        read_sovits(_ckpt("gpt"))
    with pytest.raises(CheckpointError, match="model_type"):
        read_hf_dir(_ckpt("hubert"), "bert")


def test_truncated_and_corrupt_files(tmp_path):
    src = _ckpt("gpt").read_bytes()
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(src[: len(src) // 2])
    with pytest.raises(CheckpointError) as exc:
        read_gpt(truncated)
    assert "truncated.ckpt" in str(exc.value)

    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"hello, I am not a checkpoint" * 10)
    with pytest.raises(CheckpointError, match="not a PyTorch checkpoint"):
        read_gpt(garbage)

    with pytest.raises(CheckpointError, match="not found"):
        read_gpt(tmp_path / "missing.ckpt")

    # Flip bytes inside the compressed/stored tensor data region.
    damaged = bytearray(src)
    mid = len(damaged) // 2
    damaged[mid : mid + 4096] = b"\xff" * 4096
    bad = tmp_path / "damaged.ckpt"
    bad.write_bytes(bytes(damaged))
    with pytest.raises(CheckpointError, match="damaged.ckpt"):  # zip CRC check
        read_gpt(bad)


class _Evil:
    def __reduce__(self):
        import os

        return (os.system, ("echo pwned",))


def test_restricted_unpickler_refuses_code(tmp_path):
    buf = io.BytesIO()
    pickle.dump({"weight": _Evil()}, buf, protocol=2)
    path = tmp_path / "evil.ckpt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("evil/data.pkl", buf.getvalue())
        z.writestr("evil/byteorder", "little")
    with pytest.raises(CheckpointError, match="refusing to load"):
        load_torch_file(path)


def test_hf_folders_read():
    cases = load_cases_json()
    hub = read_hf_dir(_ckpt("hubert"), "hubert")
    assert hub.config["hidden_size"] == cases["hubert_overrides"]["hidden_size"]
    bert = read_hf_dir(_ckpt("bert"), "bert")
    assert bert.config["hidden_size"] == cases["bert_overrides"]["hidden_size"]


@pytest.mark.parametrize("kind", ["gpt", "sovits", "hubert", "bert"])
def test_convert_round_trip_equals_direct_load(tmp_path, kind):
    import mlx.core as mx
    from mlx.utils import tree_flatten

    src = _ckpt(kind)
    out = L.convert(src, tmp_path / f"{kind}-mlx", kind)
    assert (out / "model.safetensors").is_file() and L.is_converted(out)
    assert L.detect_kind(out) == kind
    from_converted = dict(tree_flatten(L.load(out, kind).parameters()))
    direct = dict(tree_flatten(L.load(src, kind, cache=False).parameters()))
    assert from_converted.keys() == direct.keys()
    for k in direct:
        assert mx.array_equal(from_converted[k], direct[k]), k


def test_load_caches_conversion(tmp_path):
    src = _ckpt("gpt")
    L.load(src, "gpt", root=tmp_path)
    cached = list((tmp_path / "mlx").iterdir())
    assert len(cached) == 1 and L.is_converted(cached[0])
    L.load(src, "gpt", root=tmp_path)
    assert list((tmp_path / "mlx").iterdir()) == cached


def test_failed_conversion_leaves_nothing(tmp_path):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"PK\x03\x04broken")
    with pytest.raises(CheckpointError):
        L.convert(bad, tmp_path / "out", "gpt")
    assert not (tmp_path / "out").exists()
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".out")] == []
