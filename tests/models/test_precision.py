"""The opt-in reduced precision (``PRIMESPEECH_PRECISION``): the int8 GPT decode step (models/kernels/q8.py,
csrc/half_gemv.c) and the bfloat16 vocoder on OpenVINO (models/sovits/vocoder.py, vocoder_openvino.py).

- the kernels of every build this CPU runs against numpy: the per-row rounding bit for bit, the int8 gemv within
  float32 rounding of the dequantized product, and within its documented error of the exact weights' product
  (``|W x - S Q x| <= sum_j |x_j| S_i / 2``);
- the int8 step on the fixture GPT against the float32 numpy step on the dequantized weights (the same arithmetic:
  only the weights' rounding differs from the exact step), and its batch bit for bit as alone;
- the setting: read from the environment into the runtime, refused when unknown; where the kernels are not the
  AVX-512 build the step stays exact with one INFO line, and where the CPU has no bfloat16 products the vocoder
  stays float32 with one INFO line; where it has them, the vocoder compiles in bfloat16 and stays near float32;
- the fidelity tool (tests/tools/precision_fidelity.py) over every fixture case holding semantic tokens.
"""

from __future__ import annotations  # noqa: I001  (the package must load before mlx)

import json
import logging
import sys
from pathlib import Path

import dora_primespeech_mlx  # noqa: F401  (preloads a fast BLAS)
import mlx.core as mx
import numpy as np
import pytest
from conftest import fixtures_root, load_cases_json, require_fixture

from dora_primespeech_mlx.convert.checkpoints import read_gpt
from dora_primespeech_mlx.convert.load import from_checkpoint
from dora_primespeech_mlx.errors import ConfigError
from dora_primespeech_mlx.models.gpt.numpy_decoder import NumpyDecoder, step_batch
from dora_primespeech_mlx.models.kernels import half_gemv, q8
from dora_primespeech_mlx.models.sovits import vocoder
from dora_primespeech_mlx.runtime import Runtime
from dora_primespeech_mlx.settings import Settings

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def _builds():
    flags = half_gemv.cpu_flags()
    out = []
    for isa in half_gemv.ISAS:
        if isa != "generic" and (isinstance(flags, str) or not all(f in flags for f in half_gemv.NEEDS[isa])):
            continue
        out.append(isa)
    return out


def _quantize_numpy(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    m = np.abs(w).max(axis=1)
    inv = np.where(m > 0, np.float32(127.0) / np.where(m > 0, m, 1), 0).astype(np.float32)
    q = np.clip(np.rint(w * inv[:, None]), -127, 127).astype(np.int8)
    return q, (m / np.float32(127.0)).astype(np.float32)


@pytest.mark.parametrize("isa", _builds())
def test_q8_kernels_against_numpy(isa):
    fn = half_gemv.library(isa)
    if fn is None:
        pytest.skip(f"no {isa} kernels here")
    rng = np.random.default_rng(3)
    for n, k in ((67, 133), (96, 512), (5, 7)):
        w = (rng.standard_normal((n, k)) * rng.uniform(0.01, 3.0, (n, 1))).astype(np.float32)
        w[1] = 0.0  # a zero row: scale 0, every value 0
        m = q8.Q8Matrix.from_weight(w, fn)
        q, s = _quantize_numpy(w)
        np.testing.assert_array_equal(m.q, q)
        np.testing.assert_array_equal(m.s, s)
        assert np.all(np.abs(w - m.dequantized()) <= 0.5001 * s[:, None])
        x = rng.standard_normal(k).astype(np.float32)
        y = m @ x
        ref = m.dequantized().astype(np.float64) @ x
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * np.abs(x).sum() * s.max())
        bound = np.abs(x).sum() * s / 2 + 1e-4 * (1 + np.abs(ref))  # the rounding of the weights, documented
        assert np.all(np.abs(y - w.astype(np.float64) @ x) <= bound)


@pytest.fixture(scope="module")
def fixture_gpt():
    cases = load_cases_json()
    if not cases:
        require_fixture("models/cases.json")
    return read_gpt(require_fixture("models/" + cases["checkpoints"]["gpt"]))


def _int8_runtime():
    rt = Runtime(precision="int8")
    fn, why = q8.status(rt)
    if fn is None:
        pytest.skip(f"int8 decode step not offered here: {why}")
    return rt


def _inputs(model, rng):
    phones = rng.integers(0, model.args.phoneme_vocab_size, (1, 9))
    bert = rng.standard_normal((1, 1024, 9)).astype(np.float32)
    prompt = rng.integers(0, 1024, (1, 6))
    return phones, bert, prompt


def test_int8_step_is_the_float32_step_on_the_rounded_weights(fixture_gpt):
    """Same cache, same tokens: the int8 step's logits match numpy's float32 step whose block weights are the int8
    weights dequantized, and differ from the exact step's (the rounding is real)."""
    rt = _int8_runtime()
    model = from_checkpoint(fixture_gpt, rt)
    dec = model.decoder
    assert isinstance(dec, NumpyDecoder) and dec.weights().precision == "int8"
    rounded = from_checkpoint(fixture_gpt, Runtime())
    for block, weights in zip(rounded.layers, dec.weights().q8):
        for lin, w in zip((block.attn.qkv, block.attn.out, block.mlp.fc1, block.mlp.fc2), weights):
            lin.weight = mx.array(w.dequantized())
    ref = NumpyDecoder(rounded, half=False)
    exact = NumpyDecoder(from_checkpoint(fixture_gpt, Runtime()), half=False)
    phones, bert, prompt = _inputs(model, np.random.default_rng(0))
    states = {name: d.prefill(phones, bert, prompt, 20)[0] for name, d in (("int8", dec), ("ref", ref),
                                                                           ("exact", exact))}
    for name in ("ref", "exact"):  # one prefix for all three (the int8 runtime's prefill is the exact one)
        for a, b in zip(states[name].keys + states[name].values, states["int8"].keys + states["int8"].values):
            np.copyto(a, b)
    worst, moved = 0.0, 0.0
    for i, tok in enumerate((3, 17, 1000, 5, 5, 42)):
        out = {name: np.asarray(st.step(tok, prompt.shape[1] + i)) for name, st in states.items()}
        worst = max(worst, float(np.max(np.abs(out["int8"] - out["ref"]))))
        moved = max(moved, float(np.max(np.abs(out["int8"] - out["exact"]))))
    assert worst < 1e-4, worst
    assert moved > 10 * worst, (moved, worst)


def test_int8_batched_step_is_bit_identical_to_alone(fixture_gpt):
    rt = _int8_runtime()
    model = from_checkpoint(fixture_gpt, rt)
    dec = model.decoder
    rng = np.random.default_rng(1)
    inputs = [_inputs(model, rng) for _ in range(3)]
    alone = [dec.prefill(*a, 12)[0] for a in inputs]
    batch = [dec.prefill(*a, 12)[0] for a in inputs]
    for i in range(5):
        toks = [int(t) for t in rng.integers(0, 1024, 3)]
        pos = [a[2].shape[1] + i for a in inputs]
        got = step_batch(batch, toks, pos)
        for s, t, p, g in zip(alone, toks, pos, got):
            np.testing.assert_array_equal(s.step(t, p), g)


def test_the_setting_reaches_the_runtime(monkeypatch):
    monkeypatch.setenv("PRIMESPEECH_PRECISION", "int8")
    assert Runtime.from_settings(Settings.from_env()).precision == "int8"
    monkeypatch.delenv("PRIMESPEECH_PRECISION")
    assert Runtime.from_settings(Settings.from_env()).precision == "exact"
    with pytest.raises(ConfigError):
        Runtime(precision="int4")
    assert Runtime(precision="int8_bf16").reduced("int8") and Runtime(precision="int8_bf16").reduced("bf16")
    assert not Runtime(precision="bf16").reduced("int8") and not Runtime().reduced("bf16")


@pytest.fixture(scope="module")
def fixture_sovits():
    from dora_primespeech_mlx.convert.checkpoints import read_sovits

    cases = load_cases_json()
    if not cases:
        require_fixture("models/cases.json")
    return from_checkpoint(read_sovits(require_fixture("models/" + cases["checkpoints"]["sovits"])))


def test_without_bfloat16_products_the_vocoder_stays_float32_with_one_info_line(fixture_sovits, caplog, monkeypatch):
    monkeypatch.setattr(vocoder, "_SAID", set())
    monkeypatch.setattr(half_gemv, "cpu_flags", lambda: ["avx2", "fma", "f16c"])  # a CPU without them
    with caplog.at_level(logging.INFO, logger=vocoder.__name__):
        for _ in range(2):
            backend = vocoder.build(fixture_sovits, None, release_mlx=False, precision="bf16")
            assert backend.active != "openvino" or backend.generator.precision == "f32"
    said = [r for r in caplog.records if r.name == vocoder.__name__ and "bf16" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO and "stays float32" in said[0].getMessage()


def test_the_bfloat16_vocoder_compiles_in_bfloat16_and_stays_near_float32(fixture_sovits):
    why = vocoder.bf16_status()
    if why is not None:
        pytest.skip(f"no bfloat16 vocoder here: {why}")
    rng = np.random.default_rng(4)
    z = mx.array(rng.standard_normal((1, fixture_sovits.args.inter_channels, 40)).astype(np.float32))
    ge = mx.array(0.1 * rng.standard_normal((1, fixture_sovits.args.gin_channels, 1)).astype(np.float32))
    out = {}
    for precision in ("f32", "bf16"):
        backend = vocoder.build(fixture_sovits, None, release_mlx=False, precision=precision)
        assert (backend.active == "openvino" and backend.generator.precision == "bf16") == (precision == "bf16")
        fixture_sovits.use_vocoder(backend)
        out[precision] = np.asarray(fixture_sovits.vocode(z, ge))
    fixture_sovits.use_vocoder(vocoder.build(fixture_sovits, None, release_mlx=False))
    rms = float(np.sqrt(np.mean(out["f32"] ** 2)))
    err = float(np.sqrt(np.mean((out["f32"] - out["bf16"]) ** 2)))
    print(f"bf16 vocoder: rms difference {err:.3g} of rms {rms:.3g}")
    assert 0.0 < err < 0.05 * rms, (err, rms)  # bfloat16 keeps 8 bits of mantissa: close, not equal


def test_without_the_avx512_kernels_the_step_stays_exact_with_one_info_line(fixture_gpt, caplog, monkeypatch):
    monkeypatch.setattr(q8, "_SAID", set())
    rt = Runtime(precision="int8", isa="generic")  # the portable build runs anywhere; int8 is not offered on it
    with caplog.at_level(logging.INFO, logger=q8.__name__):
        assert q8.kernel(rt) is None
        model = from_checkpoint(fixture_gpt, rt)
        assert model.decoder.weights().precision == "exact"
    said = [r for r in caplog.records if r.name == q8.__name__]
    assert len(said) == 1 and said[0].levelno == logging.INFO and "stays exact" in said[0].getMessage()
    assert q8.kernel(Runtime(isa="generic")) is None  # exact asked: nothing said
    assert len([r for r in caplog.records if r.name == q8.__name__]) == 1


def _token_cases(root: Path) -> list[str]:
    meta = json.loads((root / "models" / "cases.json").read_text(encoding="utf-8"))
    names = []
    for case in meta.get("cases", []):
        d = np.load(root / "models" / case["file"])
        if (any(n in d.files for n in ("tokens", "semantic_tokens")) and "prompt_semantic" in d.files
                and any(n in d.files for n in ("phones", "all_phones"))):
            names.append(case["name"])
    return names


def test_the_fidelity_tool_covers_every_fixture_case():
    require_fixture("models/cases.json")
    sys.path.insert(0, str(TOOLS))
    try:
        import precision_fidelity
    finally:
        sys.path.remove(str(TOOLS))
    root = fixtures_root()
    rows = precision_fidelity.run_set(root, "int8_bf16")
    expected = _token_cases(root)
    assert expected and [r["case"] for r in rows] == expected
    offered = q8.status(Runtime(precision="int8"))[0] is not None
    bf16 = vocoder.bf16_status() is None
    for r in rows:
        assert r["precision_run"] == ("int8" if offered else "exact")
        if "mel_distance" in r:
            assert (r["vocoder_run"] == "openvino:bf16") == bf16
        assert 0.0 <= r["agreement"] <= 1.0 and r["tokens_exact"] > 0 and r["tokens_other"] > 0
        assert (r["max_logit_difference"] > 0) == offered
        if r["first_difference"] is None:
            assert r["agreement"] == 1.0
        if "mel_distance" in r:
            assert r["mel_distance"] >= 0.0 and r["mel_distance_noise"] > 0.0
            if r["first_difference"] is None and r["tokens_exact"] == r["tokens_other"]:
                assert (r["mel_distance"] > 0.0) == bf16


def test_the_engine_takes_the_setting(tmp_path, monkeypatch):
    """PRIMESPEECH_PRECISION=int8_bf16 through the engine: its GPT steps on int8 weights and its vocoder runs in
    bfloat16 where this CPU offers them (exact / float32 elsewhere), and stats() says which."""
    from dora_primespeech_mlx.assets.catalog import VoiceSpec
    from dora_primespeech_mlx.engine import GPTSoVITSEngine, SynthesisConfig

    cases = load_cases_json()
    e2e = [c for c in cases.get("cases", []) if c["name"].startswith("e2e")]
    if not e2e:
        require_fixture("models/cases.json")
        pytest.skip("no e2e case in the fixtures")
    ck, inp = cases["checkpoints"], e2e[0]["inputs"]
    voice = VoiceSpec(name="fixture-precision", language=inp["text_lang"], prompt_text=inp["prompt_text"],
                      prompt_lang=inp["prompt_lang"], speed_factor=float(inp.get("speed_factor", 1.0)),
                      gpt=require_fixture("models/" + ck["gpt"]),
                      sovits=require_fixture("models/" + ck["sovits"]),
                      reference=require_fixture("models/" + inp["ref_audio_path"]),
                      hubert=require_fixture("models/" + ck["hubert"]), bert=require_fixture("models/" + ck["bert"]),
                      source="custom")
    monkeypatch.setenv("PRIMESPEECH_PRECISION", "int8_bf16")
    eng = GPTSoVITSEngine(model_dir=tmp_path, config=SynthesisConfig(text_split_method="cut0"))
    eng.load_voice(voice)
    res = eng.synthesize(inp["text"], text_lang=inp["text_lang"], top_k=1, seed=1)
    assert len(res.semantic_tokens) > 0 and np.isfinite(np.asarray(res.audio)).all()
    st = eng.stats()["backends"]
    assert st["runtime"]["precision"] == "int8_bf16"
    int8 = q8.status(Runtime(precision="int8"))[0] is not None and st["gpt"] == "numpy"
    assert st["gpt_precision"] == ("int8" if int8 else "exact"), st
    if mx.default_device().type == mx.cpu:
        bf16 = vocoder.bf16_status() is None
        assert (st["sovits"]["backend"] == "openvino" and st["sovits"].get("precision") == "bf16") == bf16, st
