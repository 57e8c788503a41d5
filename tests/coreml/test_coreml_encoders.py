"""EncoderBackends: the CoreML/MLX encoder interface and its fallback.

* CoreML path off macOS: the real runtime code (bucket choice, padding, cropping, tail) with the
  prediction emulated by the numpy MIL interpreter on the exported fp32 program; results equal the
  MLX path / goldens within the case tolerances.
* Fallback: CoreML forced to fail (coremltools missing, package missing, load error, predict error,
  not macOS): one warning per encoder, the results are exactly the MLX results, ``status()`` reports
  the fallback, and CoreML is not tried again.
"""

from __future__ import annotations

import functools
import logging
import sys

import numpy as np
import pytest
from conftest import model_cases, require_case, require_fixture
from coreml_testlib import CASES_JSON, InterpretedModel, assert_close, converted, model_dir

from dora_primespeech_mlx.coreml import export, runtime
from dora_primespeech_mlx.engine import encoders as enc_mod
from dora_primespeech_mlx.engine.encoders import EncoderBackends

LOGGER = "dora_primespeech_mlx.engine.encoders"


@functools.lru_cache(maxsize=2)
def _mlx_hubert(path: str):
    from dora_primespeech_mlx.convert.load import load_hubert

    return load_hubert(path, cache=False)


@functools.lru_cache(maxsize=2)
def _mlx_bert(path: str):
    from dora_primespeech_mlx.convert.load import load_bert

    return load_bert(path, cache=False)


def _bert_items():
    cases = [require_case(c, CASES_JSON) for c in model_cases("bert")] or [require_case(None, CASES_JSON)]
    items, golds = [], []
    for c in cases:
        gold = np.load(require_fixture(f"models/{c['file']}"))
        items.append((c["norm_text"], [int(n) for n in gold["word2ph"]]))
        golds.append((c, gold))
    return items, golds


def _hubert_wav():
    """The first hubert case's clip (as a reference clip; the tail is appended by the backend)."""
    cases = [require_case(c, CASES_JSON) for c in model_cases("hubert")] or [require_case(None, CASES_JSON)]
    c = cases[0]
    return c, np.load(require_fixture(f"models/{c['file']}"))["wav16k"].astype(np.float32)


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """fp32 packages of the fixture encoders, saved like the cache would hold them."""
    root = tmp_path_factory.mktemp("coreml")
    out = {}
    for kind in ("hubert", "bert"):
        mlmodel, spec, _ = converted(kind, str(model_dir(kind)), "fp32")
        out[kind] = export.save_package(mlmodel, spec, root / f"{kind}.mlpackage")
    return out


def _backends(mode, packages=None, **kw) -> EncoderBackends:
    h, b = model_dir("hubert"), model_dir("bert")
    return EncoderBackends(h, b, mode=mode, packages=packages, mlx_hubert=lambda: _mlx_hubert(str(h)),
                           mlx_bert=lambda: _mlx_bert(str(b)), **kw)


def _reference(wav, items):
    mlx = _backends("mlx")
    return mlx.hubert_features(wav), mlx.bert_features_batch(items), mlx


def _emulate(monkeypatch, packages):
    """runtime.load_model -> the interpreter on the converted program of that package."""
    models = {}
    for kind, path in packages.items():
        mlmodel, spec, _ = converted(kind, str(model_dir(kind)), "fp32")
        models[str(path)] = InterpretedModel(mlmodel, spec)

    def load_model(package, units=None):
        return models[str(package)]

    monkeypatch.setattr(runtime, "load_model", load_model)
    return models


def test_mlx_mode_equals_the_models():
    from dora_primespeech_mlx.models.bert.model import bert_features, bert_features_batch
    from dora_primespeech_mlx.models.hubert.model import prompt_features

    _, wav = _hubert_wav()
    items, _ = _bert_items()
    enc = _backends("mlx")
    h = enc.hubert_features(wav)
    want = np.asarray(prompt_features(_mlx_hubert(str(model_dir("hubert"))), wav))
    np.testing.assert_array_equal(h, want)
    assert h.dtype == np.float32 and h.ndim == 3 and h.shape[0] == 1
    got = enc.bert_features_batch(items)
    model, tok = _mlx_bert(str(model_dir("bert")))
    for g, w in zip(got, bert_features_batch(model, tok, items)):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(enc.bert_features(*items[0]), bert_features(model, tok, *items[0]))
    assert enc.bert_hidden_size == model.args.hidden_size
    st = enc.status()
    assert st["mode"] == "mlx"
    for kind in ("hubert", "bert"):
        assert st[kind]["backend"] == "mlx" and not st[kind]["fallback"] and st[kind]["coreml_calls"] == 0


def test_coreml_path_emulated_matches_mlx_and_goldens(monkeypatch, packages, caplog):
    """The CoreML code path with the prediction emulated: padding to buckets and cropping give the
    MLX results (HuBERT) and the golden phone features (BERT) within the case tolerances."""
    models = _emulate(monkeypatch, packages)
    case, wav = _hubert_wav()
    items, golds = _bert_items()
    ref_h, ref_b, _ = _reference(wav, items)
    enc = _backends("coreml", packages=packages)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        h = enc.hubert_features(wav)
        b = enc.bert_features_batch(items)
    assert not [r for r in caplog.records if r.name == LOGGER], "no warning expected"
    assert_close("coreml hubert vs mlx", h, ref_h, case["tolerance"]["last_hidden_state"])
    for got, ref, (c, gold) in zip(b, ref_b, golds):
        assert_close(f"coreml {c['name']} vs golden", got, gold["phone_features"], c["tolerance"]["phone_features"])
        assert_close(f"coreml {c['name']} vs mlx", got, ref, c["tolerance"]["phone_features"])
    st = enc.status()
    assert st["hubert"]["backend"] == "coreml" and st["bert"]["backend"] == "coreml"
    assert st["hubert"]["coreml_calls"] == 1 and st["bert"]["coreml_calls"] == 1
    assert st["hubert"]["mlx_calls"] == 0 and not st["hubert"]["fallback"]
    assert st["hubert"]["package"] == str(packages["hubert"])
    assert models[str(packages["hubert"])].calls == 1 and models[str(packages["bert"])].calls == len(items)
    assert enc.bert_hidden_size == _mlx_bert(str(model_dir("bert")))[0].args.hidden_size

    # an input longer than the largest bucket is answered by MLX, without switching the backend
    spec = export.read_package_spec(packages["hubert"])
    long_wav = np.resize(wav, spec.buckets[-1] - export.PROMPT_TAIL_SAMPLES + 16000)
    got = enc.hubert_features(long_wav)
    np.testing.assert_array_equal(got, _backends("mlx").hubert_features(long_wav))
    st = enc.status()
    assert st["hubert"]["backend"] == "coreml" and st["hubert"]["mlx_calls"] == 1 and not st["hubert"]["fallback"]

    # input errors are raised, not taken for CoreML failures
    with pytest.raises(ValueError, match="word2ph"):
        enc.bert_features(items[0][0], items[0][1][:-1])
    with pytest.raises(ValueError, match="mono"):
        enc.hubert_features(np.zeros((2, 48000), np.float32))
    assert enc.status()["bert"]["backend"] == "coreml" and enc.status()["hubert"]["backend"] == "coreml"


class _FailingPredict:
    def predict(self, inputs):
        raise RuntimeError("simulated CoreML prediction failure")


FAILURES = ["coremltools-missing", "package-missing", "load-error", "predict-error", "not-macos"]


@pytest.mark.parametrize("failure", FAILURES)
def test_fallback_equals_mlx(failure, monkeypatch, packages, tmp_path, caplog):
    case, wav = _hubert_wav()
    items, _ = _bert_items()
    ref_h, ref_b, _ = _reference(wav, items)
    pkgs = dict(packages)
    loads = []
    if failure == "not-macos":
        if sys.platform == "darwin":
            pytest.skip("checks the non-macOS refusal; this is macOS")
        pkgs = None  # the normal path: export + load, refused off macOS before exporting
    else:
        monkeypatch.setattr(runtime, "prediction_supported", lambda: True)  # pretend macOS
    if failure == "coremltools-missing":
        monkeypatch.setitem(sys.modules, "coremltools", None)  # `import coremltools` raises ImportError
        expect = "coremltools is not installed"
    elif failure == "package-missing":
        pkgs = {k: tmp_path / f"missing-{k}.mlpackage" for k in ("hubert", "bert")}
        expect = "not a dora-primespeech-mlx CoreML package"
    elif failure == "load-error":
        def broken_load(package, units=None):
            loads.append(package)
            raise RuntimeError("simulated CoreML load failure")

        monkeypatch.setattr(runtime, "load_model", broken_load)
        expect = "simulated CoreML load failure"
    elif failure == "predict-error":
        def load_failing(package, units=None):
            loads.append(package)
            return _FailingPredict()

        monkeypatch.setattr(runtime, "load_model", load_failing)
        expect = "simulated CoreML prediction failure"
    else:
        expect = "needs macOS"

    enc = _backends("coreml", packages=pkgs, root=tmp_path)
    assert enc.status()["hubert"]["backend"] == "coreml"  # nothing tried yet
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(2):  # the second round must not try CoreML again
            h = enc.hubert_features(wav)
            b = enc.bert_features_batch(items)
            np.testing.assert_array_equal(h, ref_h)
            for got, ref in zip(b, ref_b):
                np.testing.assert_array_equal(got, ref)
    warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert len(warnings) == 2, [r.getMessage() for r in warnings]  # one per encoder
    assert {w.getMessage().split()[1] for w in warnings} == {"hubert", "bert"}
    st = enc.status()
    for kind in ("hubert", "bert"):
        assert st[kind]["backend"] == "mlx" and st[kind]["fallback"], st
        assert expect in st[kind]["fallback_reason"], st[kind]["fallback_reason"]
        assert st[kind]["coreml_calls"] == 0 and st[kind]["mlx_calls"] == 2
    if loads:
        assert len(loads) == 2  # one load per encoder, never retried
    if failure == "not-macos":
        assert not (tmp_path / "coreml").exists()  # no export spent on a platform that cannot run it


def test_auto_mode_off_macos_uses_mlx_quietly(caplog):
    if sys.platform == "darwin":
        pytest.skip("off-macOS behaviour")
    assert not enc_mod.coreml_available()
    _, wav = _hubert_wav()
    enc = _backends("auto")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        enc.hubert_features(wav)
    assert not [r for r in caplog.records if r.name == LOGGER]
    st = enc.status()
    assert st["mode"] == "auto" and st["hubert"]["backend"] == "mlx" and not st["hubert"]["fallback"]


def test_auto_mode_picks_coreml_when_available(monkeypatch, packages):
    monkeypatch.setattr(enc_mod, "coreml_available", lambda: True)
    _emulate(monkeypatch, packages)
    enc = _backends("auto", packages=packages)
    items, _ = _bert_items()
    enc.bert_features_batch(items[:1])
    assert enc.status()["bert"]["backend"] == "coreml" and enc.status()["bert"]["coreml_calls"] == 1


def test_mode_and_compute_units_from_the_runtime():
    """The encoder backend and CoreML's compute units are the engine runtime's (PRIMESPEECH_ENCODERS,
    PRIMESPEECH_COREML_COMPUTE_UNITS, read by the settings); an explicit ``mode`` wins."""
    from dora_primespeech_mlx.errors import ConfigError
    from dora_primespeech_mlx.runtime import Runtime
    from dora_primespeech_mlx.settings import Settings

    def rt(**env) -> Runtime:
        return Runtime.from_settings(Settings.from_env(env))

    assert _backends(None, runtime=rt(PRIMESPEECH_ENCODERS="mlx")).mode == "mlx"
    assert _backends(None, runtime=rt(PRIMESPEECH_ENCODERS="CoreML")).mode == "coreml"
    assert _backends(None).mode == "auto"
    assert _backends("mlx", runtime=rt(PRIMESPEECH_ENCODERS="coreml")).mode == "mlx"
    with pytest.raises(ValueError, match="PRIMESPEECH_ENCODERS"):
        _backends("ane")
    units = rt(PRIMESPEECH_COREML_COMPUTE_UNITS="cpu_only")
    assert _backends("coreml", runtime=units).status()["compute_units"] == "CPU_ONLY"
    with pytest.raises(ConfigError, match="PRIMESPEECH_COREML_COMPUTE_UNITS"):
        rt(PRIMESPEECH_COREML_COMPUTE_UNITS="NPU")
    with pytest.raises(ValueError, match="PRIMESPEECH_COREML_COMPUTE_UNITS"):
        _backends("auto", compute_units="NPU")
    assert _backends("mlx", compute_units="NPU").mode == "mlx"  # MLX mode does not check the CoreML setting
    assert runtime.compute_units() == "CPU_AND_NE"


def test_runtime_helpers(tmp_path):
    assert runtime.pick_bucket(16, (16, 32)) == 16
    assert runtime.pick_bucket(17, (32, 16)) == 32
    with pytest.raises(runtime.BucketError):
        runtime.pick_bucket(33, (16, 32))
    assert runtime.compiled_path(tmp_path / "bert-x-fp16.mlpackage") == tmp_path / "bert-x-fp16.mlmodelc"
    if sys.platform != "darwin":
        with pytest.raises(runtime.CoreMLError, match="needs macOS"):
            runtime.load_model(tmp_path / "x.mlpackage")


def test_cli_export_coreml(tmp_path, capsys):
    from dora_primespeech_mlx.cli import main

    src = model_dir("bert")
    out = tmp_path / "out"
    assert main(["--model-dir", str(tmp_path), "export-coreml", str(src), "--precision", "fp32", "-o", str(out)]) == 0
    pkg = out / f"bert-{src.name}-fp32.mlpackage"
    spec = export.read_package_spec(pkg)
    assert spec.kind == "bert" and spec.precision == "fp32"
    # into the cache of --model-dir, then found there
    assert main(["--model-dir", str(tmp_path), "export-coreml", str(src), "--kind", "bert",
                 "--buckets", "16,32"]) == 0
    cached = export.package_path(src, "bert", "fp16", tmp_path)
    assert export.read_package_spec(cached).buckets == (16, 32)
    assert main(["--model-dir", str(tmp_path), "export-coreml", str(src)]) == 0
    assert "(exists)" in capsys.readouterr().out
    assert main(["--model-dir", str(tmp_path), "export-coreml", str(src), "--buckets", "16"]) == 2
    assert "--buckets needs --kind" in capsys.readouterr().err
