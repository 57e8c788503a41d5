"""The SoVITS generator on OpenVINO (models/sovits/vocoder_openvino.py, ``PRIMESPEECH_VOCODER=openvino``).

Parity: every SoVITS decode case of models/cases.json is decoded with the generator on OpenVINO and compared with
the golden audio at the case's own tolerance, and with the MLX generator; dynamic lengths and batches; float32
precision whatever the CPU offers (OpenVINO's default on AMX / AVX-512 BF16 CPUs is bfloat16); the engine's setting
reaching the backend; the fallback to ONNX Runtime (one warning) where openvino is missing.
"""

from __future__ import annotations

import logging
import threading

import mlx.core as mx
import numpy as np
import pytest
from conftest import require_case, require_fixture

from dora_primespeech_mlx.convert.load import from_checkpoint
from dora_primespeech_mlx.models.sovits import vocoder

pytest.importorskip("openvino", reason="openvino is not installed (the extra `openvino`; `.[dev]` has it)")

import test_vocoder_onnx as onnx_tests  # noqa: E402  (the fixture SoVITS, its decode cases and inputs, as read there)

from dora_primespeech_mlx.models.sovits import vocoder_openvino  # noqa: E402

raw_sovits = onnx_tests.raw_sovits  # the module-scoped fixtures
mlx_model = onnx_tests.mlx_model


@pytest.fixture(scope="module")
def ov_model(raw_sovits, tmp_path_factory):
    model = from_checkpoint(raw_sovits)
    model.use_vocoder(vocoder.build(model, cache_dir=tmp_path_factory.mktemp("ov-cache"), mode="openvino", threads=2,
                                    release_mlx=False))
    return model


def test_built_on_openvino_in_float32(ov_model):
    st = vocoder.status(ov_model)
    assert st["backend"] == "openvino" and st["runtime"] == "openvino", st
    assert st["precision"] == "f32" and st["threads"] == 2 and st["layout"] == vocoder_openvino.LAYOUT
    gen = ov_model.vocoder_backend.generator
    assert "f32" in str(gen.compiled.get_property("INFERENCE_PRECISION_HINT")).lower() or \
        "float32" in str(gen.compiled.get_property("INFERENCE_PRECISION_HINT")).lower()
    assert gen.compiled.get_property("INFERENCE_NUM_THREADS") == 2


@pytest.mark.parametrize("case", onnx_tests.DECODE_PARAMS)
def test_openvino_decode_matches_golden(ov_model, mlx_model, case):
    case = require_case(case, "models/cases.json")
    d = np.load(require_fixture("models/" + case["file"]))
    tol = onnx_tests._tolerances(case)["audio"]
    refer, noise_scale, speed, noise = onnx_tests._decode_inputs(case, d, ov_model)
    before = ov_model.vocoder_backend.calls["onnx"]
    out = ov_model.decode_staged(d["codes"], d["phones"], refer, noise_scale=noise_scale, speed=speed, noise=noise)
    assert ov_model.vocoder_backend.calls["onnx"] == before + 1, "the generator did not run outside MLX"
    np.testing.assert_allclose(np.asarray(out.audio), d["audio"], atol=float(tol.get("atol", 0.0)),
                               rtol=float(tol.get("rtol", 0.0)), err_msg=case["name"])
    mlx_audio = np.asarray(mlx_model.vocode(out.z, out.ge, out.y_mask))
    diff = float(np.max(np.abs(np.asarray(out.audio) - mlx_audio)))
    assert diff <= float(tol.get("atol", 0.0)), f"OpenVINO vs MLX generator: max|diff| {diff}"


def test_lengths_batches_and_threads(ov_model, mlx_model):
    """Dynamic time and batch (stream windows are short), and two threads calling at once (the vocoder lane and a
    caller): each gets its own request and the right audio."""
    rng = np.random.default_rng(0)
    c, gin = ov_model.args.inter_channels, ov_model.args.gin_channels
    ge = (rng.standard_normal((1, gin, 1)) * 0.3).astype(np.float32)
    gen = ov_model.vocoder_backend.generator
    for frames in (1, 3, 17, 40):
        z = rng.standard_normal((1, c, frames)).astype(np.float32)
        a = gen(z, ge)
        assert a.shape == (1, 1, frames * ov_model.samples_per_frame)
        np.testing.assert_allclose(a, np.asarray(mlx_model.vocode(mx.array(z), mx.array(ge))), atol=1e-4)
    z2 = rng.standard_normal((2, c, 5)).astype(np.float32)
    np.testing.assert_allclose(gen(z2, ge), np.asarray(mlx_model.vocode(mx.array(z2), mx.array(ge))), atol=1e-4)
    zs = [rng.standard_normal((1, c, 7 + 4 * i)).astype(np.float32) for i in range(4)]
    want = [gen(z, ge) for z in zs]
    got: dict[int, np.ndarray] = {}

    def work(i):
        for _ in range(3):
            got[i] = gen(zs[i], ge)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        np.testing.assert_array_equal(got[i], want[i])


def test_graph_in_memory_without_a_cache(raw_sovits, mlx_model):
    gen = vocoder_openvino.load_or_build(mlx_model.dec, None, threads=1)
    assert gen.path is None and gen.threads == 1 and gen.layout == vocoder_openvino.LAYOUT
    rng = np.random.default_rng(1)
    z = rng.standard_normal((1, mlx_model.args.inter_channels, 9)).astype(np.float32)
    ge = (rng.standard_normal((1, mlx_model.args.gin_channels, 1)) * 0.3).astype(np.float32)
    np.testing.assert_allclose(gen(z, ge), np.asarray(mlx_model.vocode(mx.array(z), mx.array(ge))), atol=1e-4)


def test_setting_reaches_the_backend():
    from dora_primespeech_mlx.settings import Settings

    assert Settings.from_env({vocoder.ENV: "openvino"}).vocoder == "openvino"
    assert "openvino" in vocoder.MODES


def test_falls_back_to_onnxruntime_without_openvino(monkeypatch, raw_sovits, caplog):
    onnx_tests.block_import(monkeypatch, "openvino")
    model = from_checkpoint(raw_sovits)
    with caplog.at_level(logging.WARNING):
        model.use_vocoder(vocoder.build(model, cache_dir=None, mode="openvino", threads=1, release_mlx=False))
    st = vocoder.status(model)
    assert st["backend"] == "onnxruntime" and "OpenVINO unavailable" in st["reason"], st
    assert sum("OpenVINO unavailable" in r.getMessage() for r in caplog.records) == 1
    rng = np.random.default_rng(2)
    z = mx.array(rng.standard_normal((1, model.args.inter_channels, 4)).astype(np.float32))
    ge = mx.array((rng.standard_normal((1, model.args.gin_channels, 1)) * 0.3).astype(np.float32))
    before = model.vocoder_backend.calls["onnx"]
    model.vocode(z, ge)
    assert model.vocoder_backend.calls["onnx"] == before + 1
