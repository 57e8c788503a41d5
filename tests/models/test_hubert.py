"""CNHubert (HF HubertModel) in MLX against the PyTorch goldens: every ``hubert*`` case of
models/cases.json plus the HuBERT part of the end-to-end case, with the tolerances recorded there."""

from __future__ import annotations

import functools

import mlx.core as mx
import numpy as np
import pytest
from conftest import (
    load_cases_json,
    model_cases,
    param_or_missing,
    require_case,
    require_fixture,
)

from dora_primespeech_mlx.convert.checkpoints import read_hf_dir
from dora_primespeech_mlx.convert.load import from_checkpoint
from dora_primespeech_mlx.models.hubert.model import (
    PROMPT_TAIL_SAMPLES,
    HubertArgs,
    HubertModel,
    prompt_features,
)

CASES_JSON = "models/cases.json"
HUBERT_CASES = model_cases("hubert")
E2E_CASES = [c for c in model_cases("e2e") if "hubert_last_hidden_state" in c.get("tolerance", {})]


@functools.lru_cache(maxsize=4)
def _model(model_dir: str) -> HubertModel:
    return from_checkpoint(read_hf_dir(model_dir, "hubert"))


def _model_for(rel: str) -> HubertModel:
    return _model(str(require_fixture(f"models/{rel}")))


def _assert_close(name: str, got, want: np.ndarray, tol: dict) -> float:
    got = np.asarray(got, dtype=np.float32)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != golden {want.shape}"
    err = float(np.abs(got - want).max()) if want.size else 0.0
    np.testing.assert_allclose(
        got, want, atol=tol.get("atol", 0.0), rtol=tol.get("rtol", 0.0), err_msg=f"{name} (max abs err {err:.3g})"
    )
    return err


@pytest.mark.parametrize("case", param_or_missing(HUBERT_CASES, lambda c: c["name"], "hubert cases"))
def test_hubert_matches_golden(case):
    case = require_case(case, CASES_JSON)
    model = _model_for(case["model"])
    gold = np.load(require_fixture(f"models/{case['file']}"))
    tol = case["tolerance"]
    # The intermediates have no tolerance of their own in cases.json; they are held to the
    # hidden-state tolerance (they are upstream of hidden_states[0]).
    tol_inner = tol.get("hidden_states", tol["last_hidden_state"])

    wav = gold["wav16k"].astype(np.float32)
    out = model(mx.array(wav)[None], output_hidden_states=True)
    T = model.args.num_frames(wav.shape[0])
    assert out.last_hidden_state.shape == (1, T, model.args.hidden_size)

    _assert_close("last_hidden_state", out.last_hidden_state, gold["last_hidden_state"], tol["last_hidden_state"])
    if "hidden_states" in gold.files:
        hs = np.stack([np.asarray(h[0]) for h in out.hidden_states])
        _assert_close("hidden_states", hs, gold["hidden_states"], tol_inner)
    if "conv_features" in gold.files:  # golden is (B, C, T); ours is channels-last
        _assert_close("conv_features", out.conv_features.transpose(0, 2, 1), gold["conv_features"], tol_inner)
    if "projected_features" in gold.files:
        _assert_close("projected_features", out.projected_features, gold["projected_features"], tol_inner)
    if "pos_conv" in gold.files:
        _assert_close("pos_conv", out.pos_conv, gold["pos_conv"], tol_inner)

    # the plain call returns the same last_hidden_state
    plain = np.asarray(model(mx.array(wav)[None]))
    np.testing.assert_array_equal(plain, np.asarray(out.last_hidden_state))


@pytest.mark.parametrize("case", param_or_missing(E2E_CASES, lambda c: c["name"], "e2e case"))
def test_hubert_e2e_prompt(case):
    """e2e: the stored 16 kHz input (already carrying the 9600-zero tail) -> last_hidden_state; and
    ``prompt_features`` on the same clip without the tail appends it and returns (1, 768, T)."""
    case = require_case(case, CASES_JSON)
    model = _model_for(load_cases_json()["checkpoints"]["hubert"])
    gold = np.load(require_fixture(f"models/{case['file']}"))
    tol = case["tolerance"]["hubert_last_hidden_state"]
    wav = gold["wav16k"].astype(np.float32)
    want = gold["hubert_last_hidden_state"]

    _assert_close("e2e hubert_last_hidden_state", model(mx.array(wav)[None]), want, tol)

    assert not wav[-PROMPT_TAIL_SAMPLES:].any(), "e2e wav16k should end with the 0.6 s zero tail"
    feats = prompt_features(model, wav[:-PROMPT_TAIL_SAMPLES])
    _assert_close("e2e prompt_features", feats, want.transpose(0, 2, 1), tol)


def test_num_frames_base_formula():
    args = HubertArgs()  # base kernels/strides
    for n in (400, 401, 719, 720, 48000 + 9600, 160000 + 9600):
        assert args.num_frames(n) == (n - 400) // 320 + 1
    assert args.num_frames(399) == 0
    assert args.receptive_field == 400


def test_sanitize_accepts_parametrizations_names():
    rel = load_cases_json().get("checkpoints", {}).get("hubert")
    if rel is None:
        require_fixture(CASES_JSON)
        pytest.skip("cases.json names no hubert checkpoint")
    raw = read_hf_dir(require_fixture(f"models/{rel}"), "hubert")
    base = HubertModel.sanitize(raw.weights)
    renamed = {}
    for k, v in raw.weights.items():
        k = k.replace(".weight_g", ".parametrizations.weight.original0")
        renamed[k.replace(".weight_v", ".parametrizations.weight.original1")] = v
    assert any("parametrizations" in k for k in renamed)
    other = HubertModel.sanitize(renamed)
    assert sorted(other) == sorted(base)
    for k in base:
        np.testing.assert_array_equal(other[k], base[k])
    assert "masked_spec_embed" not in base
    assert all(v.dtype == np.float32 for v in base.values())
    # pos-conv weight in MLX layout (out, K, in / groups)
    args = HubertArgs.from_config(raw.config)
    w = base["encoder.pos_conv_embed.conv.weight"]
    assert w.shape == (
        args.hidden_size,
        args.num_conv_pos_embeddings,
        args.hidden_size // args.num_conv_pos_embedding_groups,
    )


def test_too_short_waveform_is_a_clear_error():
    model = HubertModel(HubertArgs(hidden_size=48, num_hidden_layers=1, num_attention_heads=4,
                                   intermediate_size=32, conv_dim=[8] * 7, num_conv_pos_embeddings=4,
                                   num_conv_pos_embedding_groups=4))
    with pytest.raises(ValueError, match="too short"):
        model(mx.zeros((1, 399)))
    with pytest.raises(ValueError, match="batch, samples"):
        model(mx.zeros((400,)))


def test_unsupported_config_is_rejected():
    with pytest.raises(ValueError, match="feat_extract_norm"):
        HubertArgs.from_config({"feat_extract_norm": "layer", "do_stable_layer_norm": True})


def test_odd_pos_conv_kernel_keeps_all_frames():
    """Random small model with an odd pos-conv kernel: the positional conv keeps T frames."""
    args = HubertArgs(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=16,
                      conv_dim=[8] * 7, num_conv_pos_embeddings=5, num_conv_pos_embedding_groups=4)
    model = HubertModel(args)
    n = 400 + 320 * 6
    out = model(mx.array(np.random.default_rng(0).standard_normal((2, n)).astype(np.float32)),
                output_hidden_states=True)
    assert out.pos_conv.shape == (2, 7, 32)
    assert len(out.hidden_states) == 3
