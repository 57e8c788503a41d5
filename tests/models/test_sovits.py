"""SoVITS synthesizer against the golden data of the original GPT-SoVITS (models/cases.json).

Every case whose name starts with "sovits" is checked on every intermediate its npz holds (extract_latent:
``ssl_proj``, exact ``codes``, ``quantized``; decode: ``ge``, ``quantized_50hz``, ``enc_p_x``, ``m_p``,
``logs_p``, ``y_mask``, ``z_p``, ``z``, ``audio``), plus the SoVITS part of the "e2e" case (decode of the
generated tokens with the replayed noise, and the int16 output). Parameters and tolerances come from
each case. Run with ``-s`` to see the max errors next to their tolerances.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from audio_testlib import to_int16_output
from conftest import load_cases_json, model_cases, param_or_missing, require_case, require_fixture

from dora_primespeech_mlx.convert.checkpoints import RawCheckpoint, read_sovits
from dora_primespeech_mlx.convert.load import from_checkpoint
from dora_primespeech_mlx.models import audio
from dora_primespeech_mlx.models.sovits.model import SoVITSArgs, SoVITSModel

SOVITS_CASES = model_cases("sovits")
E2E_CASES = model_cases("e2e")
SOVITS_PARAMS = param_or_missing(SOVITS_CASES, lambda c: c["name"], "models/cases.json sovits cases")
E2E_PARAMS = param_or_missing(E2E_CASES, lambda c: c["name"], "models/cases.json e2e case")
DECODE_PARAMS = param_or_missing(
    [c for c in SOVITS_CASES if "audio" in c.get("outputs", {})], lambda c: c["name"], "sovits decode cases"
)

DECODE_STAGES = ("ge", "quantized_50hz", "enc_p_x", "m_p", "logs_p", "y_mask", "z_p", "z", "audio")
LATENT_STAGES = ("ssl_proj", "codes", "quantized")
# Arrays a case may store without a tolerance of their own: compared with a related quantity's tolerance.
RELATED = {"z_p": ("z", "m_p"), "quantized_50hz": ("quantized",), "y_mask": ()}


def _checkpoint_rel() -> str:
    cases = load_cases_json()
    if not cases:
        require_fixture("models/cases.json")
    return "models/" + cases["checkpoints"]["sovits"]


@pytest.fixture(scope="module")
def raw_sovits() -> RawCheckpoint:
    return read_sovits(require_fixture(_checkpoint_rel()))


@pytest.fixture(scope="module")
def model(raw_sovits) -> SoVITSModel:
    return from_checkpoint(raw_sovits)


def _tolerances(case) -> dict:
    """``{"z": {...}, "m_p": {...}}`` from keys like ``"z / m_p / logs_p / enc_p_x"``."""
    out = {}
    for key, tol in case.get("tolerance", {}).items():
        for name in key.split("/"):
            out[name.strip()] = tol
    return out


def _tolerance_for(tols: dict, name: str):
    if name in tols:
        return tols[name]
    for other in RELATED.get(name, ()):
        if other in tols:
            return tols[other]
    return "exact"  # a mask or a codebook lookup: no arithmetic, so no error either


def _check(name: str, ours, golden, tol, report: list):
    ours = np.asarray(ours)
    golden = np.asarray(golden)
    assert ours.shape == golden.shape, f"{name}: shape {ours.shape} != golden {golden.shape}"
    if tol == "exact":
        diff = int(np.sum(ours.astype(np.int64) != golden.astype(np.int64))) if golden.dtype.kind in "iu" else None
        if diff is None:
            err = float(np.max(np.abs(ours.astype(np.float64) - golden))) if golden.size else 0.0
            report.append(f"{name}: max|err| {err:.3g} (exact)")
            assert err == 0.0, f"{name}: expected an exact match, max abs error {err}"
        else:
            report.append(f"{name}: {diff} mismatches (exact)")
            assert diff == 0, f"{name}: {diff} of {golden.size} values differ"
        return
    atol, rtol = float(tol.get("atol", 0.0)), float(tol.get("rtol", 0.0))
    err = float(np.max(np.abs(ours.astype(np.float64) - golden))) if golden.size else 0.0
    report.append(f"{name}: max|err| {err:.3g} (atol {atol:g}, rtol {rtol:g})")
    np.testing.assert_allclose(ours, golden, atol=atol, rtol=rtol, err_msg=name)


def _load(case):
    case = require_case(case, "models/cases.json")
    return case, np.load(require_fixture("models/" + case["file"]))


@pytest.mark.parametrize("case", SOVITS_PARAMS)
def test_sovits_case(model, case):
    case, d = _load(case)
    tols = _tolerances(case)
    report: list[str] = []
    if "ssl" in d.files:  # extract_latent
        out = model.extract_latent(d["ssl"], return_intermediates=True)
        stages = [s for s in LATENT_STAGES if s in d.files]
        assert stages, f"{case['name']}: no extract_latent outputs to compare"
        for stage in stages:
            _check(stage, out[stage], d[stage], _tolerance_for(tols, stage), report)
        np.testing.assert_array_equal(np.asarray(model.extract_latent(d["ssl"])), np.asarray(out["codes"]))
    else:  # decode
        params = case.get("params", {})
        refer = d["refer_spec"] if "refer_spec" in d.files else None
        if "ref_wav_32k" in d.files:
            spec = audio.spectrogram(
                d["ref_wav_32k"],
                params.get("filter_length", model.args.filter_length),
                params.get("hop_length", model.args.hop_length),
                params.get("win_length", model.args.win_length),
            )
            if refer is not None:
                _check("refer_spec", spec, refer, _tolerance_for(tols, "refer_spec"), report)
            refer = spec
        assert refer is not None, f"{case['name']}: neither refer_spec nor ref_wav_32k stored"
        noise_scale = float(params.get("noise_scale", 0.5))
        noise = d["noise"] if "noise" in d.files else None
        if noise_scale != 0:
            assert noise is not None, f"{case['name']}: noise_scale {noise_scale} but no noise stored to replay"
        out = model.decode_staged(
            d["codes"], d["phones"], refer, noise_scale=noise_scale, speed=float(params.get("speed", 1.0)), noise=noise
        )
        stages = [s for s in DECODE_STAGES if s in d.files]
        assert "audio" in stages, f"{case['name']}: no audio stored"
        for stage in stages:
            _check(stage, getattr(out, stage), d[stage], _tolerance_for(tols, stage), report)
        # the one-call decode gives the staged result
        audio_direct = model.decode(
            d["codes"],
            d["phones"],
            ge=out.ge,
            noise_scale=noise_scale,
            speed=float(params.get("speed", 1.0)),
            noise=noise,
        )
        np.testing.assert_allclose(np.asarray(audio_direct), np.asarray(out.audio), atol=1e-6)
    print(f"\n[{case['name']}] " + "; ".join(report))


@pytest.mark.parametrize("case", E2E_PARAMS)
def test_e2e_sovits_part(model, case):
    """decode(semantic_tokens, text_phones, spec(ref), noise replay, noise_scale 0.5) and the int16 output."""
    case, d = _load(case)
    tols = _tolerances(case)
    report: list[str] = []
    # The reference is read as torchaudio does: int16 / 32768 (a 32 kHz file: no resampling).
    wav = d["ref_wav_32k_int16"].astype(np.float32) / 32768.0
    spec = audio.spectrogram(wav, model.args.filter_length, model.args.hop_length, model.args.win_length)
    if "refer_spec" in d.files:
        assert spec.shape == d["refer_spec"].shape
        report.append(f"refer_spec: max|err| {np.max(np.abs(spec - d['refer_spec'])):.3g}")
    tokens = np.asarray(d["semantic_tokens"]).reshape(1, 1, -1)
    phones = np.asarray(d["text_phones"]).reshape(1, -1)
    speed = float(case.get("inputs", {}).get("speed_factor", 1.0))
    noise = d["noise"] if "noise" in d.files else None
    out = model.decode(tokens, phones, spec, noise_scale=0.5 if noise is not None else 0.0, speed=speed, noise=noise)
    wave = np.asarray(out)[0, 0]
    _check("sovits_audio", wave, d["sovits_audio"], _tolerance_for(tols, "sovits_audio"), report)
    if "output_int16" in d.files:
        sr = int(case.get("output_sample_rate", model.sampling_rate))
        interval = float(case.get("inputs", {}).get("fragment_interval", 0.3))
        pcm = to_int16_output([wave], sr, interval)
        assert pcm.dtype == np.int16
        _check(
            "output_int16",
            pcm.astype(np.int64),
            d["output_int16"].astype(np.int64),
            _tolerance_for(tols, "output_int16"),
            report,
        )
    print(f"\n[{case['name']} / sovits] " + "; ".join(report))


# ---------------------------------------------------------------------------------------------------------
# API, loading and versions (fixture checkpoint, no goldens needed)


def test_streaming_stages_compose_to_decode(model):
    rng = np.random.default_rng(0)
    codes = rng.integers(0, model.args.codebook_size, (1, 1, 7))
    phones = rng.integers(0, model.args.n_symbols, (1, 9))
    spec = np.abs(rng.standard_normal((1, model.args.spec_channels, 20))).astype(np.float32)
    ge = model.ref_embedding(spec)
    assert ge.shape == (1, model.args.gin_channels, 1)
    y = model.encode_features(codes, phones, ge)
    assert y.shape == (1, model.args.hidden_channels, 14)
    x, m_p, logs_p, y_mask = model.project(y, 1.0)
    m_p2, logs_p2, y_mask2 = model.encode(codes, phones, ge)
    np.testing.assert_array_equal(np.asarray(m_p), np.asarray(m_p2))
    z_p = model.sample_prior(m_p, logs_p, 0.5, seed=3)
    z = model.flow_reverse(z_p, y_mask, ge)
    wave = model.vocode(z, ge, y_mask)
    assert wave.shape == (1, 1, 14 * model.samples_per_frame)
    direct = model.decode(codes, phones, spec, noise_scale=0.5, seed=3)
    np.testing.assert_allclose(np.asarray(direct), np.asarray(wave), atol=1e-6)
    # a ready ge works in place of the spectrogram, and a list of references averages the embeddings
    np.testing.assert_allclose(np.asarray(model.decode(codes, phones, ge, 0.5, seed=3)), np.asarray(wave), atol=1e-6)
    ge2 = model.ref_embedding([spec, spec * 0.5])
    np.testing.assert_allclose(
        np.asarray(ge2), (np.asarray(ge) + np.asarray(model.ref_embedding(spec * 0.5))) / 2, atol=1e-6
    )
    # speed changes the number of frames to int(T / speed) + 1
    _, m_fast, _, mask_fast = model.project(y, 1.5)
    assert m_fast.shape[-1] == int(14 / 1.5) + 1 == mask_fast.shape[-1]


def test_noise_seed_and_scale(model):
    rng = np.random.default_rng(1)
    m_p = mx.array(rng.standard_normal((1, model.args.inter_channels, 5)).astype(np.float32))
    logs_p = mx.array(rng.standard_normal((1, model.args.inter_channels, 5)).astype(np.float32) * 0.1)
    a = np.asarray(model.sample_prior(m_p, logs_p, 0.5, seed=7))
    b = np.asarray(model.sample_prior(m_p, logs_p, 0.5, seed=7))
    c = np.asarray(model.sample_prior(m_p, logs_p, 0.5, seed=8))
    np.testing.assert_array_equal(a, b)
    assert np.abs(a - c).max() > 1e-3
    np.testing.assert_array_equal(np.asarray(model.sample_prior(m_p, logs_p, 0.0, seed=7)), np.asarray(m_p))
    noise = rng.standard_normal(m_p.shape).astype(np.float32)
    # float32 arithmetic: each of exp, the two products and the sum rounds once (exp within 2 ulp), so the
    # result is within a few ulp of each term's magnitude, not of the (possibly cancelled) sum's
    term = noise.astype(np.float64) * np.exp(np.asarray(logs_p, dtype=np.float64)) * 0.5
    expected = np.asarray(m_p, dtype=np.float64) + term
    bound = 4 * np.finfo(np.float32).eps * (np.abs(np.asarray(m_p)) + np.abs(term))
    got = np.asarray(model.sample_prior(m_p, logs_p, 0.5, noise=noise)).astype(np.float64)
    assert np.all(np.abs(got - expected) <= bound), float(np.max(np.abs(got - expected) / bound))
    with pytest.raises(ValueError, match="noise has shape"):
        model.sample_prior(m_p, logs_p, 0.5, noise=noise[:, :, :3])


def test_sanitize_drops_training_keys_and_loads_strict(raw_sovits, model):
    weights = SoVITSModel.sanitize(raw_sovits.weights)
    assert not any(k.startswith("enc_q.") or "weight_g" in k or "weight_v" in k for k in weights)
    assert [k for k in weights if k.startswith("quantizer.")] == ["quantizer.embed"]
    assert all(v.dtype == np.float32 for v in weights.values())
    ups = raw_sovits.weights["dec.ups.0.weight_v"]  # (Ci, Co, K) -> (Co, K, Ci)
    assert weights["dec.ups.0.weight"].shape == (ups.shape[1], ups.shape[2], ups.shape[0])
    args = SoVITSArgs.from_config(raw_sovits.config, version=raw_sovits.version)
    assert args.inter_channels == raw_sovits.config["model"]["inter_channels"]
    assert args.spec_channels == raw_sovits.config["data"]["filter_length"] // 2 + 1
    fresh = SoVITSModel(args)
    fresh.load_weights([(k, mx.array(v)) for k, v in weights.items()], strict=True)
    assert SoVITSArgs(**args.to_dict()) == args


def _as_v1(raw: RawCheckpoint) -> RawCheckpoint:
    """The fixture checkpoint reshaped into a v1 layout: 322 symbols, reference encoder on all bins."""
    weights = dict(raw.weights)
    weights["enc_p.text_embedding.weight"] = weights["enc_p.text_embedding.weight"][:322]
    fc = weights["ref_enc.spectral.0.fc.weight"]
    n_bins = raw.config["data"]["filter_length"] // 2 + 1
    extra = np.zeros((fc.shape[0], n_bins - fc.shape[1]), dtype=fc.dtype)
    extra[:, -1] = 1.0  # make the last bin matter
    weights["ref_enc.spectral.0.fc.weight"] = np.concatenate([fc, extra], axis=1)
    config = {**raw.config, "model": {**raw.config["model"], "version": "v1"}}
    return RawCheckpoint(raw.path, "sovits", weights, config, "v1")


def test_v1_layout_loads_and_uses_all_bins(raw_sovits):
    v1 = from_checkpoint(_as_v1(raw_sovits))
    assert v1.args.version == "v1" and v1.args.ref_bins == v1.args.spec_channels
    rng = np.random.default_rng(2)
    spec = np.abs(rng.standard_normal((1, v1.args.spec_channels, 12))).astype(np.float32)
    ge_a = np.asarray(v1.ref_embedding(spec))
    spec[:, -1] += 5.0
    assert np.abs(np.asarray(v1.ref_embedding(spec)) - ge_a).max() > 1e-4
    wave = v1.decode(rng.integers(0, 1024, (1, 1, 3)), rng.integers(0, 322, (1, 4)), spec, noise_scale=0.0)
    assert wave.shape == (1, 1, 6 * v1.samples_per_frame)


def test_v2_ignores_bins_above_704(model):
    rng = np.random.default_rng(3)
    spec = np.abs(rng.standard_normal((1, model.args.spec_channels, 12))).astype(np.float32)
    ge_a = np.asarray(model.ref_embedding(spec))
    spec[:, model.args.ref_bins :] += 5.0
    np.testing.assert_array_equal(np.asarray(model.ref_embedding(spec)), ge_a)


def test_mismatched_checkpoint_is_reported(raw_sovits, model):
    weights = dict(raw_sovits.weights)
    weights["enc_p.text_embedding.weight"] = weights["enc_p.text_embedding.weight"][:322]
    bad = RawCheckpoint(raw_sovits.path, "sovits", weights, raw_sovits.config, "v2")
    with pytest.raises(ValueError, match="text embedding has 322 rows"):
        from_checkpoint(bad)
    with pytest.raises(ValueError, match="reference spectrogram"):
        model.ref_embedding(np.zeros((1, 80, 10), np.float32))


@pytest.mark.parametrize("case", DECODE_PARAMS)
def test_native_conv_path_matches(model, case):
    """The native MLX conv ops (used on Metal/CUDA) give the GEMM path's audio, within the case tolerance."""
    from dora_primespeech_mlx.models.sovits import conv

    case, d = _load(case)
    params = case.get("params", {})
    kwargs = dict(
        noise_scale=float(params.get("noise_scale", 0.5)),
        speed=float(params.get("speed", 1.0)),
        noise=d["noise"] if "noise" in d.files else None,
    )
    ge = model.ref_embedding(d["refer_spec"])
    old = model.conv_impl
    try:
        gemm = np.asarray(model.prepare("gemm").decode(d["codes"], d["phones"], ge=ge, **kwargs))
        assert all(m.impl == "native" for _, m in model.prepare("native").named_modules()
                   if isinstance(m, (conv.Conv1d, conv.ConvTranspose1d)))
        native = np.asarray(model.decode(d["codes"], d["phones"], ge=ge, **kwargs))
    finally:
        model.prepare(old)
    report: list[str] = []
    _check("audio (native)", native, d["audio"], _tolerance_for(_tolerances(case), "audio"), report)
    np.testing.assert_allclose(gemm, native, atol=1e-4)
    print(f"\n[{case['name']} native] " + "; ".join(report) + f"; gemm vs native {np.abs(gemm - native).max():.3g}")
