"""Shared pieces of the CoreML tests: exported programs (cached per session), the fp16 bound, and an
emulated CoreML model that runs a converted program with the numpy MIL interpreter."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from conftest import load_cases_json, require_fixture

from dora_primespeech_mlx.coreml import export
from dora_primespeech_mlx.coreml.interpreter import run_program

# fp16 programs are checked against the fp32 PyTorch goldens with a looser, documented bound: the
# max abs error must stay below FP16_REL_BOUND x max|golden|. Observed on the fixture models: 0.7 %
# for HuBERT (raw waveform through the fp16 conv front end and the time GroupNorm), 0.16 % for BERT.
FP16_REL_BOUND = 2e-2

CASES_JSON = "models/cases.json"


def model_dir(kind: str, rel: str | None = None):
    """Fixture folder of a model (``rel`` from a case, else the cases.json checkpoint of ``kind``)."""
    if rel is None:
        rel = load_cases_json().get("checkpoints", {}).get(kind)
        if rel is None:
            require_fixture(CASES_JSON)
            pytest.skip(f"cases.json names no {kind} checkpoint")
    return require_fixture(f"models/{rel}")


@functools.lru_cache(maxsize=8)
def converted(kind: str, path: str, precision: str):
    """(in-memory MLModel, ExportSpec, args) of a fixture encoder; converted once per session."""
    args, weights, pad_id = export.load_weights(path, kind)
    if kind == "hubert":
        model, spec = export.convert_hubert(weights, args, precision)
    else:
        model, spec = export.convert_bert(weights, args, precision, pad_id=pad_id)
    return model, spec, args


def assert_close(name: str, got, want, tol: dict) -> float:
    got = np.asarray(got, dtype=np.float32)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != golden {want.shape}"
    err = float(np.abs(got - want).max()) if want.size else 0.0
    np.testing.assert_allclose(got, want, atol=tol.get("atol", 0.0), rtol=tol.get("rtol", 0.0),
                               err_msg=f"{name} (max abs err {err:.3g})")
    return err


def assert_fp16_bound(name: str, got, want) -> float:
    got = np.asarray(got, dtype=np.float32)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != golden {want.shape}"
    assert np.isfinite(got).all(), f"{name}: non-finite values"
    err = float(np.abs(got - want).max())
    bound = FP16_REL_BOUND * float(np.abs(want).max())
    assert err <= bound, f"{name}: fp16 max abs err {err:.4g} > {bound:.4g} ({FP16_REL_BOUND} x max|golden|)"
    return err


class InterpretedModel:
    """Stands in for ``ct.models.MLModel`` off macOS: ``predict`` runs the converted MIL program with
    the numpy interpreter (same inputs/outputs as the real package), and checks the input shapes
    against the enumerated buckets like CoreML does."""

    def __init__(self, mlmodel, spec):
        self.prog = mlmodel._mil_program
        self.spec = spec
        self.calls = 0

    def predict(self, inputs):
        self.calls += 1
        name = "wav" if self.spec.kind == "hubert" else "input_ids"
        shape = tuple(np.shape(inputs[name]))
        assert shape[0] == 1 and shape[1] in self.spec.buckets, f"{name} shape {shape} is not an enumerated bucket"
        return run_program(self.prog, inputs)
