"""CoreML export of the encoders, checked on Linux: the converted MIL programs (after coremltools'
passes, fp32 and fp16) are evaluated with the numpy MIL interpreter on inputs padded to a bucket, and
the cropped outputs are compared with the PyTorch goldens of every ``hubert*`` / ``bert*`` case (fp32:
the case tolerance; fp16: ``FP16_REL_BOUND``). The saved packages are validated (inputs, outputs,
enumerated shapes, precision)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import load_cases_json, model_cases, param_or_missing, require_case, require_fixture
from coreml_testlib import CASES_JSON, assert_close, assert_fp16_bound, converted, model_dir

from dora_primespeech_mlx.coreml import export
from dora_primespeech_mlx.coreml.interpreter import run_program

HUBERT_CASES = model_cases("hubert")
BERT_CASES = model_cases("bert")
E2E_CASES = [c for c in model_cases("e2e") if "hubert_last_hidden_state" in c.get("tolerance", {})]


def _run_hubert(mlmodel, spec, wav: np.ndarray, bucket: int) -> np.ndarray:
    n = wav.shape[0]
    x = np.zeros((1, bucket), np.float32)
    x[0, :n] = wav
    out = run_program(mlmodel._mil_program, {"wav": x, "num_samples": np.array([n], np.int32)})
    y = out["last_hidden_state"]
    assert y.shape[:3] == (1, spec.args["hidden_size"], 1)
    return y


def _hubert_frames(args, n: int) -> int:
    return args.num_frames(n)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("case", param_or_missing(HUBERT_CASES, lambda c: c["name"], "hubert cases"))
def test_hubert_program_matches_golden(case, precision):
    case = require_case(case, CASES_JSON)
    mlmodel, spec, args = converted("hubert", str(model_dir("hubert", case["model"])), precision)
    gold = np.load(require_fixture(f"models/{case['file']}"))
    wav = gold["wav16k"].astype(np.float32)
    want = gold["last_hidden_state"][0].T  # (hidden, T)
    T = _hubert_frames(args, wav.shape[0])
    bucket = next((b for b in spec.buckets if b >= wav.shape[0]), None)
    assert bucket is not None, f"{case['name']}: {wav.shape[0]} samples exceed every bucket"
    # the tightest bucket and the largest (whose conv-0 frame count exceeds int16: no int16 casts allowed)
    buckets = sorted({bucket, spec.buckets[-1]})
    for b in buckets:
        y = _run_hubert(mlmodel, spec, wav, b)
        assert y.shape[3] == args.num_frames(b)
        got = y[0, :, 0, :T]
        if precision == "fp32":
            assert_close(f"{case['name']} fp32 bucket {b}", got, want, case["tolerance"]["last_hidden_state"])
        else:
            assert_fp16_bound(f"{case['name']} fp16 bucket {b}", got, want)


@pytest.mark.parametrize("case", param_or_missing(E2E_CASES, lambda c: c["name"], "e2e case"))
def test_hubert_program_e2e_reference(case):
    """The e2e reference clip (with its 0.6 s tail) through the fp32 program, padded to its bucket."""
    case = require_case(case, CASES_JSON)
    mlmodel, spec, args = converted("hubert", str(model_dir("hubert")), "fp32")
    gold = np.load(require_fixture(f"models/{case['file']}"))
    wav = gold["wav16k"].astype(np.float32)
    want = gold["hubert_last_hidden_state"][0].T
    bucket = next((b for b in spec.buckets if b >= wav.shape[0]), None)
    if bucket is None:
        pytest.skip(f"e2e clip of {wav.shape[0]} samples is longer than the largest bucket")
    y = _run_hubert(mlmodel, spec, wav, bucket)
    assert_close("e2e hubert fp32", y[0, :, 0, : want.shape[1]], want, case["tolerance"]["hubert_last_hidden_state"])


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("case", param_or_missing(BERT_CASES, lambda c: c["name"], "bert cases"))
def test_bert_program_matches_golden(case, precision):
    case = require_case(case, CASES_JSON)
    mlmodel, spec, args = converted("bert", str(model_dir("bert", case["model"])), precision)
    gold = np.load(require_fixture(f"models/{case['file']}"))
    ids = gold["input_ids"][0].astype(np.int32)
    L = ids.shape[0]
    want = gold["hidden_states"][args.num_layers_run]  # hidden_states[-3]: (L, H)
    tol = case["tolerance"].get("hidden_states", case["tolerance"]["phone_features"])
    fitting = [b for b in spec.buckets if b >= L]
    assert fitting, f"{case['name']}: {L} tokens exceed every bucket {spec.buckets}"
    for b in sorted({fitting[0], fitting[-1]}):  # the tightest bucket and the largest
        x = np.full((1, b), spec.pad_id, np.int32)
        x[0, :L] = ids
        y = run_program(mlmodel._mil_program, {"input_ids": x})["hidden"]
        assert y.shape == (1, args.hidden_size, 1, b)
        got = y[0, :, 0, :L].T
        if precision == "fp32":
            assert_close(f"{case['name']} fp32 bucket {b}", got, want, tol)
        else:
            assert_fp16_bound(f"{case['name']} fp16 bucket {b}", got, want)


def _dtype_counts(mil_spec) -> dict[str, int]:
    import coremltools as ct

    fn = mil_spec.mlProgram.functions["main"]
    ops = fn.block_specializations[fn.opset].operations
    counts: dict[str, int] = {}
    for op in ops:
        if op.type == "const":
            for out in op.outputs:
                name = ct.proto.MIL_pb2.DataType.Name(out.type.tensorType.dataType)
                counts[name] = counts.get(name, 0) + 1
    return counts


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
@pytest.mark.parametrize("kind", ["hubert", "bert"])
def test_package_spec(kind, precision, tmp_path):
    """Saved package: input/output names, dtypes, enumerated bucket shapes, precision, metadata."""
    import coremltools as ct

    mlmodel, spec, args = converted(kind, str(model_dir(kind)), precision)
    path = export.save_package(mlmodel, spec, tmp_path / f"{kind}.mlpackage")
    assert path.is_dir() and (path / "Manifest.json").is_file()
    assert export.read_package_spec(path) == spec
    assert spec.precision == precision and spec.version == export.EXPORT_VERSION

    loaded = ct.models.MLModel(str(path), skip_model_load=True)
    ms = loaded.get_spec()
    assert ms.WhichOneof("Type") == "mlProgram"
    assert ms.specificationVersion >= 8  # macOS 14 / iOS 17 (one flexible input suffices)
    inputs = {i.name: i.type.multiArrayType for i in ms.description.input}
    outputs = {o.name: o.type.multiArrayType for o in ms.description.output}
    array_type = ct.proto.FeatureTypes_pb2.ArrayFeatureType
    INT32, FLOAT32 = array_type.INT32, array_type.FLOAT32
    if kind == "hubert":
        assert set(inputs) == {"wav", "num_samples"} and set(outputs) == {"last_hidden_state"}
        flexible, fixed = inputs["wav"], inputs["num_samples"]
        assert flexible.dataType == FLOAT32 and fixed.dataType == INT32
        assert list(fixed.shape) == [1] and not fixed.enumeratedShapes.shapes
        assert spec.buckets == export.HUBERT_BUCKETS
        assert all((b - export.PROMPT_TAIL_SAMPLES) % export.SAMPLE_RATE == 0 for b in spec.buckets)
        assert spec.buckets[0] == 3 * 16000 + 9600 and spec.buckets[-1] == 10 * 16000 + 9600
        assert outputs["last_hidden_state"].dataType == FLOAT32
    else:
        assert set(inputs) == {"input_ids"} and set(outputs) == {"hidden"}
        flexible = inputs["input_ids"]
        assert flexible.dataType == INT32
        assert spec.buckets == export.token_buckets(args.max_position_embeddings)
        assert max(spec.buckets) <= args.max_position_embeddings
        assert outputs["hidden"].dataType == FLOAT32
    shapes = [tuple(s.shape) for s in flexible.enumeratedShapes.shapes]
    assert shapes == [(1, b) for b in spec.buckets]
    assert tuple(flexible.shape) == (1, spec.buckets[0])  # default shape = smallest bucket
    meta = json.loads(ms.description.metadata.userDefined["primespeech_export"])
    assert meta == spec.to_dict()
    counts = _dtype_counts(ms)
    if precision == "fp16":
        assert counts.get("FLOAT16", 0) > 0, f"fp16 package has no fp16 weights: {counts}"
    else:
        assert counts.get("FLOAT16", 0) == 0, f"fp32 package has fp16 constants: {counts}"
        assert counts.get("FLOAT32", 0) > 0


def test_buckets():
    assert export.HUBERT_BUCKETS == tuple(s * 16000 + 9600 for s in range(3, 11))
    assert export.token_buckets(512) == (16, 32, 64, 128, 256, 512)
    assert export.token_buckets(128) == (16, 32, 64, 128)
    assert export.token_buckets(100) == (16, 32, 64, 100)
    assert export.token_buckets(2048) == (16, 32, 64, 128, 256, 512)
    assert export.hubert_buckets([73600, 57600, 57600]) == (57600, 73600)


def test_bad_precision_is_rejected():
    mlmodel_args = export.load_weights(model_dir("bert"), "bert")
    args, weights, pad_id = mlmodel_args
    with pytest.raises(ValueError, match="precision"):
        export.convert_bert(weights, args, precision="int8", pad_id=pad_id)


def test_converted_folder_gives_the_same_weights(tmp_path):
    """load_weights reads a converted MLX folder (safetensors) to the same arrays as the original."""
    from dora_primespeech_mlx.convert.load import convert

    src = model_dir("bert")
    dst = convert(src, tmp_path / "bert-mlx", "bert")
    a_args, a_w, a_pad = export.load_weights(src, "bert")
    b_args, b_w, b_pad = export.load_weights(dst, "bert")
    assert a_args == b_args and a_pad == b_pad and sorted(a_w) == sorted(b_w)
    for k in a_w:
        np.testing.assert_array_equal(a_w[k], b_w[k])
    assert load_cases_json()  # the fixture set is present


def test_package_cache_path_and_reuse(tmp_path, monkeypatch):
    """ensure_package exports once into <root>/coreml and reuses the package afterwards."""
    src = model_dir("bert")
    calls = []
    real = export.export_encoder

    def counting(*a, **kw):
        calls.append(a)
        return real(*a, **kw)

    monkeypatch.setattr(export, "export_encoder", counting)
    p1 = export.ensure_package(src, "bert", "fp32", root=tmp_path)
    p2 = export.ensure_package(src, "bert", "fp32", root=tmp_path)
    assert p1 == p2 and p1.parent == tmp_path / "coreml" and p1.name.endswith("-fp32.mlpackage")
    assert len(calls) == 1
    assert export.read_package_spec(p1).kind == "bert"
    assert export.package_path(src, "bert", "fp16", tmp_path) != p1


def _naive_conv2d(x, w, b, stride, pad, groups):
    """Reference conv (loops), NCHW / OIHW, custom padding (top, bottom, left, right)."""
    x = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[1]), (pad[2], pad[3])))
    B, C, H, W = x.shape
    O, Cg, KH, KW = w.shape
    oh, ow = (H - KH) // stride[0] + 1, (W - KW) // stride[1] + 1
    out = np.zeros((B, O, oh, ow))
    og = O // groups
    for o in range(O):
        g = o // og
        for i in range(oh):
            for j in range(ow):
                r, c = i * stride[0], j * stride[1]
                patch = x[:, g * Cg : (g + 1) * Cg, r : r + KH, c : c + KW]
                out[:, o, i, j] = (patch * w[o]).sum(axis=(1, 2, 3)) + b[o]
    return out


@pytest.mark.parametrize(("stride", "pad", "groups"), [((1, 1), (0, 0, 0, 0), 1), ((1, 3), (0, 0, 0, 0), 1),
                                                       ((1, 1), (0, 0, 2, 2), 4), ((2, 1), (1, 1, 3, 2), 2)])
def test_interpreter_conv_kernel(stride, pad, groups):
    """The interpreter's conv kernel (no value inference exists for conv) against a loop reference,
    inside a small builder program."""
    from coremltools.converters.mil import Builder as mb

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 8, 5, 23)).astype(np.float32)
    w = rng.standard_normal((12, 8 // groups, 2, 3)).astype(np.float32)
    b = rng.standard_normal(12).astype(np.float32)

    @mb.program(input_specs=[mb.TensorSpec(shape=x.shape)])
    def prog(x_in):
        return mb.conv(x=x_in, weight=w, bias=b, strides=list(stride), pad_type="custom", pad=list(pad),
                       groups=groups, name="y")

    got = run_program(prog, {"x_in": x})["y"]
    np.testing.assert_allclose(got, _naive_conv2d(x, w, b, stride, pad, groups), atol=1e-4, rtol=1e-5)
