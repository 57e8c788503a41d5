"""The SoVITS generator on ONNX Runtime (models/sovits/vocoder_onnx.py, models/sovits/vocoder.py).

Parity: every SoVITS decode case of models/cases.json (and the SoVITS part of the e2e case) is decoded
with the generator on ONNX Runtime and compared with the golden audio at the case's own tolerance, and
with the MLX generator. Then the backend's plumbing: the on-disk cache (built once, atomically, keyed by
the weights), the choice by ``PRIMESPEECH_VOCODER`` and device, the thread setting, and the fallback to
MLX (one warning, visible in the status) when onnxruntime is missing or a run fails.
"""

from __future__ import annotations

import builtins
import logging

import mlx.core as mx
import numpy as np
import pytest
from conftest import load_cases_json, model_cases, param_or_missing, require_case, require_fixture

from dora_primespeech_mlx.convert.checkpoints import read_sovits
from dora_primespeech_mlx.convert.load import from_checkpoint
from dora_primespeech_mlx.models import audio
from dora_primespeech_mlx.models.sovits import vocoder

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (a Linux dependency)")
pytest.importorskip("onnx", reason="onnx is not installed (a Linux dependency)")

from dora_primespeech_mlx.models.sovits import vocoder_onnx  # noqa: E402

SOVITS_CASES = model_cases("sovits")
DECODE_PARAMS = param_or_missing(
    [c for c in SOVITS_CASES if "audio" in c.get("outputs", {})], lambda c: c["name"], "sovits decode cases"
)
E2E_PARAMS = param_or_missing(model_cases("e2e"), lambda c: c["name"], "models/cases.json e2e case")


def _tolerances(case) -> dict:
    out = {}
    for key, tol in case.get("tolerance", {}).items():
        for name in key.split("/"):
            out[name.strip()] = tol
    return out


def _assert_close(name: str, ours, golden, tol: dict) -> float:
    ours, golden = np.asarray(ours), np.asarray(golden)
    assert ours.shape == golden.shape, f"{name}: shape {ours.shape} != golden {golden.shape}"
    atol, rtol = float(tol.get("atol", 0.0)), float(tol.get("rtol", 0.0))
    err = float(np.max(np.abs(ours.astype(np.float64) - golden))) if golden.size else 0.0
    np.testing.assert_allclose(ours, golden, atol=atol, rtol=rtol, err_msg=name)
    return err


@pytest.fixture(scope="module")
def raw_sovits():
    cases = load_cases_json()
    if not cases:
        require_fixture("models/cases.json")
    return read_sovits(require_fixture("models/" + cases["checkpoints"]["sovits"]))


@pytest.fixture(scope="module")
def onnx_model(raw_sovits, tmp_path_factory):
    """The fixture SoVITS with the ONNX Runtime generator forced on."""
    model = from_checkpoint(raw_sovits)
    model.use_vocoder(vocoder.build(model, cache_dir=tmp_path_factory.mktemp("onnx-cache"), mode="onnx"))
    assert model.vocoder_backend.generator is not None, vocoder.status(model)
    return model


@pytest.fixture(scope="module")
def mlx_model(raw_sovits):
    model = from_checkpoint(raw_sovits)
    model.use_vocoder(vocoder.build(model, mode="mlx"))
    return model


def _decode_inputs(case, d, model):
    params = case.get("params", {})
    if "ref_wav_32k" in d.files:
        refer = audio.spectrogram(
            d["ref_wav_32k"],
            params.get("filter_length", model.args.filter_length),
            params.get("hop_length", model.args.hop_length),
            params.get("win_length", model.args.win_length),
        )
    else:
        refer = d["refer_spec"]
    noise_scale = float(params.get("noise_scale", 0.5))
    noise = d["noise"] if "noise" in d.files else None
    return refer, noise_scale, float(params.get("speed", 1.0)), noise


@pytest.mark.parametrize("case", DECODE_PARAMS)
def test_onnx_decode_matches_golden(onnx_model, mlx_model, case):
    case = require_case(case, "models/cases.json")
    d = np.load(require_fixture("models/" + case["file"]))
    tol = _tolerances(case)["audio"]
    refer, noise_scale, speed, noise = _decode_inputs(case, d, onnx_model)
    before = onnx_model.vocoder_backend.calls["onnx"]
    out = onnx_model.decode_staged(d["codes"], d["phones"], refer, noise_scale=noise_scale, speed=speed, noise=noise)
    assert onnx_model.vocoder_backend.calls["onnx"] == before + 1, "the generator did not run on ONNX Runtime"
    err = _assert_close("audio", out.audio, d["audio"], tol)
    # and against the MLX generator on the same latent
    mlx_audio = np.asarray(mlx_model.vocode(out.z, out.ge, out.y_mask))
    diff = float(np.max(np.abs(np.asarray(out.audio) - mlx_audio)))
    assert diff <= float(tol.get("atol", 0.0)), f"ONNX vs MLX generator: max|diff| {diff}"
    print(f"\n[{case['name']} / onnx] audio max|err| {err:.3g} (atol {tol.get('atol')}); vs MLX {diff:.3g}")


@pytest.mark.parametrize("case", E2E_PARAMS)
def test_onnx_e2e_sovits_part(onnx_model, case):
    case = require_case(case, "models/cases.json")
    d = np.load(require_fixture("models/" + case["file"]))
    model = onnx_model
    wav = d["ref_wav_32k_int16"].astype(np.float32) / 32768.0
    spec = audio.spectrogram(wav, model.args.filter_length, model.args.hop_length, model.args.win_length)
    tokens = np.asarray(d["semantic_tokens"]).reshape(1, 1, -1)
    phones = np.asarray(d["text_phones"]).reshape(1, -1)
    speed = float(case.get("inputs", {}).get("speed_factor", 1.0))
    noise = d["noise"] if "noise" in d.files else None
    out = model.decode(tokens, phones, spec, noise_scale=0.5 if noise is not None else 0.0, speed=speed, noise=noise)
    err = _assert_close("sovits_audio", np.asarray(out)[0, 0], d["sovits_audio"], _tolerances(case)["sovits_audio"])
    print(f"\n[{case['name']} / onnx] sovits_audio max|err| {err:.3g}")


def test_batch_and_lengths(onnx_model, mlx_model):
    """Dynamic batch and time: several lengths (short windows, as streaming uses) and a batch of two."""
    rng = np.random.default_rng(0)
    c = onnx_model.args.inter_channels
    ge = mx.array(rng.standard_normal((1, onnx_model.args.gin_channels, 1)).astype(np.float32) * 0.3)
    for frames in (1, 3, 17):
        z = mx.array(rng.standard_normal((1, c, frames)).astype(np.float32))
        a = np.asarray(onnx_model.vocode(z, ge))
        b = np.asarray(mlx_model.vocode(z, ge))
        assert a.shape == b.shape == (1, 1, frames * onnx_model.samples_per_frame)
        np.testing.assert_allclose(a, b, atol=1e-4)
    z2 = mx.array(rng.standard_normal((2, c, 5)).astype(np.float32))
    ge2 = mx.concatenate([ge, ge * 0.5], axis=0)
    np.testing.assert_allclose(np.asarray(onnx_model.vocode(z2, ge2)), np.asarray(mlx_model.vocode(z2, ge2)),
                               atol=1e-4)


def test_cache_built_once_and_keyed_by_weights(mlx_model, tmp_path):
    dec = mlx_model.dec
    g1 = vocoder_onnx.load_or_build(dec, tmp_path, threads=1)
    files = sorted(tmp_path.glob("sovits-generator-*.onnx"))
    assert len(files) == 1 and g1.path == files[0]
    assert not list(tmp_path.glob("*.tmp")), "a temporary file was left behind"
    stamp = files[0].stat().st_mtime_ns
    g2 = vocoder_onnx.load_or_build(dec, tmp_path, threads=1)
    assert g2.path == files[0] and files[0].stat().st_mtime_ns == stamp, "the cached graph was rebuilt"
    # a damaged cache file is rebuilt, not trusted
    files[0].write_bytes(b"not an onnx model")
    g3 = vocoder_onnx.load_or_build(dec, tmp_path, threads=1)
    z = np.ones((1, mlx_model.args.inter_channels, 2), np.float32)
    ge = np.zeros((1, mlx_model.args.gin_channels, 1), np.float32)
    np.testing.assert_array_equal(g3(z, ge), g1(z, ge))
    # other weights, other file
    w = dict(vocoder_onnx.generator_weights(dec))
    w2 = dict(w)
    w2["conv_post.weight"] = w["conv_post.weight"] * 2
    assert vocoder_onnx.weights_digest(w) != vocoder_onnx.weights_digest(w2)


def test_threads_follow_the_package_setting(monkeypatch, mlx_model):
    from dora_primespeech_mlx import _blas

    monkeypatch.setattr(_blas, "thread_settings", lambda: {"blas_threads": 2})
    assert vocoder_onnx.resolve_threads() == 2
    monkeypatch.setattr(_blas, "thread_settings", lambda: {"blas_threads": "default"})
    assert vocoder_onnx.resolve_threads() == 0  # the library's default
    assert vocoder_onnx.resolve_threads(1) == 1
    gen = vocoder_onnx.load_or_build(mlx_model.dec, None, threads=2)
    assert gen.threads == 2 and gen.session.get_session_options().intra_op_num_threads == 2


def test_mode_setting(raw_sovits):
    from dora_primespeech_mlx.errors import ConfigError
    from dora_primespeech_mlx.settings import Settings

    with pytest.raises(ConfigError, match=vocoder.ENV):
        Settings.from_env({vocoder.ENV: "bogus"})
    assert Settings.from_env({vocoder.ENV: "MLX"}).vocoder == "mlx"
    assert Settings.from_env({}).vocoder == "auto"
    with pytest.raises(ValueError):
        vocoder.build(from_checkpoint(raw_sovits), mode="bogus")
    model = from_checkpoint(raw_sovits)
    assert vocoder.status(model)["backend"] == "mlx"  # no backend given
    model.use_vocoder(vocoder.build(model, mode="mlx"))
    assert vocoder.status(model)["backend"] == "mlx" and model.vocoder_backend.generator is None
    model.use_vocoder(vocoder.build(model, mode="auto"))  # the tests run MLX on the CPU: ONNX Runtime is chosen
    expected = "onnxruntime" if mx.default_device().type == mx.cpu else "mlx"
    assert vocoder.status(model)["backend"] == expected


def block_import(monkeypatch, package: str) -> None:
    """For one test, ``import package`` (and its submodules) raises ImportError, as where it is not installed."""
    real_import = builtins.__import__

    def blocked(name, *args, **kwargs):
        if name == package or name.startswith(package + "."):
            raise ImportError(f"No module named '{package}' (simulated)")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", blocked)


def test_fallback_when_onnxruntime_is_missing(monkeypatch, raw_sovits, caplog):
    block_import(monkeypatch, "onnxruntime")
    model = from_checkpoint(raw_sovits)
    with caplog.at_level(logging.WARNING, logger=vocoder.__name__):
        model.use_vocoder(vocoder.build(model, cache_dir=None, mode="onnx"))
    st = vocoder.status(model)
    assert st["backend"] == "mlx" and "onnxruntime" in st["error"]
    assert sum("SoVITS vocoder" in r.getMessage() for r in caplog.records) == 1
    z = mx.zeros((1, model.args.inter_channels, 2))
    ge = mx.zeros((1, model.args.gin_channels, 1))
    assert model.vocode(z, ge).shape == (1, 1, 2 * model.samples_per_frame)


def test_fallback_when_a_run_fails(raw_sovits, mlx_model, caplog):
    model = from_checkpoint(raw_sovits)
    model.use_vocoder(vocoder.build(model, cache_dir=None, mode="onnx"))
    assert vocoder.status(model)["backend"] == "onnxruntime"

    def broken(z, ge):
        raise RuntimeError("simulated onnxruntime failure")

    model.vocoder_backend.generator = broken
    rng = np.random.default_rng(2)
    z = mx.array(rng.standard_normal((1, model.args.inter_channels, 3)).astype(np.float32))
    ge = mx.array(rng.standard_normal((1, model.args.gin_channels, 1)).astype(np.float32))
    with caplog.at_level(logging.WARNING, logger=vocoder.__name__):
        a = model.vocode(z, ge)
        b = model.vocode(z, ge)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(mlx_model.vocode(z, ge)))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert sum("simulated onnxruntime failure" in r.getMessage() for r in caplog.records) == 1
    st = vocoder.status(model)
    assert st["backend"] == "mlx" and "simulated" in st["error"] and st["calls"]["mlx"] == 2


def test_layouts_agree(mlx_model):
    """The 1-D and the default 2-D (NCHWc-friendly) graphs compute the same generator."""
    rng = np.random.default_rng(3)
    z = rng.standard_normal((1, mlx_model.args.inter_channels, 6)).astype(np.float32)
    ge = (rng.standard_normal((1, mlx_model.args.gin_channels, 1)) * 0.3).astype(np.float32)
    one = vocoder_onnx.load_or_build(mlx_model.dec, None, threads=1, layout="1d")
    two = vocoder_onnx.load_or_build(mlx_model.dec, None, threads=1, layout="2d")
    ref = np.asarray(mlx_model.vocode(mx.array(z), mx.array(ge)))
    np.testing.assert_allclose(one(z, ge), ref, atol=1e-4)
    np.testing.assert_allclose(two(z, ge), ref, atol=1e-4)
    with pytest.raises(ValueError, match="layout"):
        vocoder_onnx.build_generator_model(mlx_model.dec, layout="3d")


@pytest.mark.parametrize("threads", [1, 2])
def test_build_picks_the_layout_by_threads(raw_sovits, mlx_model, threads):
    """One thread: the 2-D graph (ONNX Runtime's NCHWc kernels); more: the 1-D one (its threaded GEMM scales
    better); both compute the generator (test_layouts_agree)."""
    model = from_checkpoint(raw_sovits)
    model.use_vocoder(vocoder.build(model, cache_dir=None, mode="onnx", threads=threads, release_mlx=False))
    gen = model.vocoder_backend.generator
    assert gen.threads == threads
    assert gen.layout == vocoder_onnx.layout_for(threads) == ("2d" if threads == 1 else "1d")
    assert vocoder.status(model)["layout"] == gen.layout
    z, ge = _inputs(model)
    np.testing.assert_allclose(np.asarray(model.vocode(z, ge)), np.asarray(mlx_model.vocode(z, ge)), atol=1e-4)


@pytest.mark.parametrize("spin", [None, True, False])
def test_build_sets_whether_the_intra_op_threads_spin(raw_sovits, mlx_model, spin):
    """PRIMESPEECH_VOCODER_SPIN: the session's threads spin between convolutions only when asked (None: the default,
    off); the samples do not depend on it."""
    model = from_checkpoint(raw_sovits)
    model.use_vocoder(vocoder.build(model, cache_dir=None, mode="onnx", threads=2, release_mlx=False, spin=spin))
    gen = model.vocoder_backend.generator
    want = bool(spin)
    assert gen.spin is want and gen.describe()["spin"] is want
    entry = gen.session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning")
    assert entry == ("1" if want else "0")
    z, ge = _inputs(model)
    np.testing.assert_allclose(np.asarray(model.vocode(z, ge)), np.asarray(mlx_model.vocode(z, ge)), atol=1e-4)


@pytest.mark.parametrize("parts", [2, 3])
def test_split_vocoder_gives_the_same_samples(mlx_model, parts):
    """PRIMESPEECH_VOCODER_PARTS: the latent cut into stretches with the generator's receptive field as margin,
    run at once on one single-threaded session, gives the whole run's samples; without the margin it does not."""
    from dora_primespeech_mlx.models.sovits.vocoder_split import MIN_FRAMES_PER_MARGIN, SplitRunner

    sovits = mlx_model
    gen = vocoder_onnx.OnnxGenerator(vocoder_onnx.build_generator_model(sovits.dec).SerializeToString(), threads=1)
    margin, hop = sovits.dec.receptive_frames, sovits.samples_per_frame
    frames = parts * MIN_FRAMES_PER_MARGIN * margin + 7
    rng = np.random.default_rng(5)
    z = rng.standard_normal((1, sovits.args.inter_channels, frames)).astype(np.float32)
    ge = rng.standard_normal((1, sovits.dec.cond.weight.shape[2], 1)).astype(np.float32)
    whole = gen(z, ge)
    runner = SplitRunner(gen, parts, margin, hop)
    assert runner.parts_for(frames) == parts
    split = runner(z, ge)
    assert split.shape == whole.shape
    np.testing.assert_allclose(split, whole, rtol=0, atol=1e-6)
    # an engine's thread plan with fewer free cores than parts now: the one-thread session runs it whole
    calls, free = [], [1]
    counted = SplitRunner(lambda a, b: (calls.append(a.shape[2]), gen(a, b))[1], parts, margin, hop,
                          cores=lambda: free[0])
    np.testing.assert_array_equal(counted(z, ge), whole)
    assert calls == [frames]
    free[0], calls[:] = parts, []
    np.testing.assert_allclose(counted(z, ge), whole, rtol=0, atol=1e-6)
    assert len(calls) == parts
    no_margin = SplitRunner(gen, parts, 0, hop)
    no_margin.parts_for = lambda n: parts
    assert np.abs(no_margin(z, ge) - whole).max() > 1e-3
    short = frames // (parts + 1)
    assert runner.parts_for(short) < parts  # short latents are cut less (margins would dominate)


def test_auto_parts_cut_at_two_threads_and_run_short_latents_whole(raw_sovits, mlx_model, tmp_path):
    """PRIMESPEECH_VOCODER_PARTS=auto: at two threads the latent is cut in two on the one-thread 2-D graph, a latent
    too short for that runs whole on the two-thread graph; every length gives the MLX generator's samples; at
    one thread nothing is cut."""
    from dora_primespeech_mlx.models.sovits.vocoder_split import MIN_FRAMES_PER_MARGIN

    assert [vocoder.auto_parts(t) for t in (0, 1, 2, 3, 8)] == [1, 1, 2, 1, 1]
    model = from_checkpoint(raw_sovits)
    model.use_vocoder(vocoder.build(model, cache_dir=tmp_path, mode="onnx", threads=2, release_mlx=False, parts="auto"))
    backend = model.vocoder_backend
    split = backend.split
    assert split is not None and split.parts == 2
    assert (backend.generator.threads, backend.generator.layout) == (2, "1d")
    assert (split.fn.threads, split.fn.layout) == (1, "2d") and split.whole is backend.generator
    assert vocoder.status(model)["split"]["whole_below_frames"] == 2 * MIN_FRAMES_PER_MARGIN * split.margin
    calls = []
    for name in ("fn", "whole"):
        run = getattr(split, name)
        setattr(split, name, lambda z, ge, run=run, name=name: calls.append(name) or run(z, ge))
    rng = np.random.default_rng(3)
    ge = rng.standard_normal((1, model.dec.cond.weight.shape[2], 1)).astype(np.float32)
    for frames, expected in ((2 * MIN_FRAMES_PER_MARGIN * split.margin - 1, ["whole"]),
                             (2 * MIN_FRAMES_PER_MARGIN * split.margin + 3, ["fn", "fn"])):
        calls.clear()
        z = rng.standard_normal((1, model.args.inter_channels, frames)).astype(np.float32)
        audio = np.asarray(model.vocode(mx.array(z), mx.array(ge)))
        assert calls == expected, frames
        np.testing.assert_allclose(audio, np.asarray(mlx_model.vocode(mx.array(z), mx.array(ge))), atol=1e-4)
    one = from_checkpoint(raw_sovits)
    one.use_vocoder(vocoder.build(one, cache_dir=tmp_path, mode="onnx", threads=1, release_mlx=False, parts="auto"))
    assert one.vocoder_backend.split is None and one.vocoder_backend.generator.layout == "2d"


# -- memory: the MLX generator weights are not kept while ONNX Runtime serves the generator ---------------------


@pytest.fixture()
def converted_sovits(tmp_path):
    """The fixture SoVITS as a converted folder (what the engine loads), so its weights can be read back."""
    from dora_primespeech_mlx.convert import load

    cases = load_cases_json()
    if not cases:
        require_fixture("models/cases.json")
    src = require_fixture("models/" + cases["checkpoints"]["sovits"])
    return load.convert(src, tmp_path / "sovits-converted", "sovits")


def _dec_bytes(model) -> int:
    from mlx.utils import tree_flatten

    return sum(v.nbytes for _, v in tree_flatten(model.dec.parameters()))


def _inputs(model, frames: int = 3, seed: int = 4):
    rng = np.random.default_rng(seed)
    z = mx.array(rng.standard_normal((1, model.args.inter_channels, frames)).astype(np.float32))
    ge = mx.array((rng.standard_normal((1, model.args.gin_channels, 1)) * 0.3).astype(np.float32))
    return z, ge


def test_mlx_weights_dropped_while_onnx_serves(converted_sovits, mlx_model, tmp_path):
    from dora_primespeech_mlx.convert import load

    model = load.load_sovits(converted_sovits)
    full = _dec_bytes(model)
    assert full > 0 and model.weights_file == converted_sovits / "model.safetensors"
    model.use_vocoder(vocoder.build(model, cache_dir=tmp_path / "onnx", mode="onnx"))
    st = vocoder.status(model)
    assert st["backend"] == "onnxruntime" and st["mlx_weights"]["dropped"], st
    assert _dec_bytes(model) == 0 and st["mlx_weights"]["bytes"] >= full
    session = model.vocoder_backend.generator.session
    assert st["arena"] is False and not session.get_session_options().enable_cpu_mem_arena
    z, ge = _inputs(model)
    np.testing.assert_allclose(np.asarray(model.vocode(z, ge)), np.asarray(mlx_model.vocode(z, ge)), atol=1e-4)
    assert vocoder.status(model)["mlx_weights"]["dropped"], "an ONNX Runtime run must not read the weights back"


def test_fallback_after_the_weights_were_dropped(converted_sovits, mlx_model, tmp_path, caplog):
    """A forced ONNX Runtime failure: the MLX generator weights are read back from the converted file (once)
    and the call and every later one are answered by MLX exactly as by a model that never dropped them."""
    from dora_primespeech_mlx.convert import load

    model = load.load_sovits(converted_sovits)
    model.use_vocoder(vocoder.build(model, cache_dir=tmp_path / "onnx", mode="onnx"))
    assert _dec_bytes(model) == 0

    def broken(z, ge):
        raise RuntimeError("simulated onnxruntime failure")

    model.vocoder_backend.generator = broken
    z, ge = _inputs(model, frames=5)
    with caplog.at_level(logging.WARNING, logger=vocoder.__name__):
        a = model.vocode(z, ge)
        b = model.vocode(z, ge)
    expected = np.asarray(mlx_model.vocode(z, ge))
    np.testing.assert_array_equal(np.asarray(a), expected)
    np.testing.assert_array_equal(np.asarray(b), expected)
    st = vocoder.status(model)
    assert st["backend"] == "mlx" and "simulated" in st["error"] and st["calls"]["mlx"] == 2, st
    assert st["mlx_weights"] == dict(st["mlx_weights"], dropped=False, restores=1), st
    assert _dec_bytes(model) == _dec_bytes(mlx_model)
    assert sum("simulated onnxruntime failure" in r.getMessage() for r in caplog.records) == 1


def test_rebuild_reads_the_weights_back(converted_sovits, mlx_model, tmp_path):
    from dora_primespeech_mlx.convert import load

    model = load.load_sovits(converted_sovits)
    model.use_vocoder(vocoder.build(model, cache_dir=tmp_path / "onnx", mode="onnx"))
    model.use_vocoder(vocoder.build(model, cache_dir=tmp_path / "onnx", mode="onnx"))  # built from the real weights
    assert len(list((tmp_path / "onnx").glob("sovits-generator-*.onnx"))) == 1
    model.use_vocoder(vocoder.build(model, mode="mlx"))
    assert vocoder.status(model)["backend"] == "mlx" and _dec_bytes(model) == _dec_bytes(mlx_model)
    z, ge = _inputs(model)
    np.testing.assert_array_equal(np.asarray(model.vocode(z, ge)), np.asarray(mlx_model.vocode(z, ge)))


def test_changed_file_is_not_read_back(converted_sovits, tmp_path):
    """Weights read back must be the ones the ONNX graph was built from: a converted file rewritten with other
    generator weights is refused (an error, not different audio)."""
    from safetensors.numpy import load_file, save_file

    from dora_primespeech_mlx.convert import load

    model = load.load_sovits(converted_sovits)
    model.use_vocoder(vocoder.build(model, cache_dir=tmp_path / "onnx", mode="onnx"))
    path = converted_sovits / "model.safetensors"
    weights = load_file(str(path))
    weights["dec.conv_post.weight"] = weights["dec.conv_post.weight"] * 2
    save_file(weights, str(path))
    model.vocoder_backend.fail("forced")
    with pytest.raises(RuntimeError, match="changed"):
        model.vocode(*_inputs(model))


def test_models_built_in_memory_keep_their_weights(onnx_model):
    """No converted file to read them back from (``from_checkpoint``): the MLX weights stay."""
    assert onnx_model.vocoder_backend.mlx_weights is None and _dec_bytes(onnx_model) > 0
