"""CoreML export of the two encoders (CNHubert and Chinese RoBERTa) with coremltools' MIL builder.

No torch: the programs are written op by op from the **sanitized** numpy weights (``HubertModel.sanitize`` and
``BertModel.sanitize`` list the names and layouts), so the export runs on Linux too; only prediction needs
macOS. Packages are ML Programs (``minimum_deployment_target`` macOS 14, fp16 by default, fp32 on request) whose
inputs are padded to enumerated bucket shapes; the padding leaves the unpadded result (checked numerically by
tests/coreml). :func:`convert_hubert` and :func:`convert_bert` give each package's inputs and outputs,
:func:`hubert_program` why padding is exact, :func:`_convert` the Neural Engine layout
(docs/coreml.md, "The Neural Engine layout")."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..convert import load

log = logging.getLogger(__name__)

EXPORT_VERSION = 1  # bump when the programs change: cached packages are then rebuilt
SAMPLE_RATE = 16000
PROMPT_TAIL_SAMPLES = 9600  # == models.hubert.PROMPT_TAIL_SAMPLES (kept here to avoid importing mlx)
# reference audio 3..10 s plus the 0.6 s tail, 1 s steps
HUBERT_BUCKETS: tuple[int, ...] = tuple(s * SAMPLE_RATE + PROMPT_TAIL_SAMPLES for s in range(3, 11))
TOKEN_BUCKETS: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
MASK_NEG = -1.0e4  # additive score for padded keys: exp() underflows to 0 in fp16 and fp32
PRECISIONS = ("fp16", "fp32")
PACKAGE_META = "primespeech_export.json"  # written inside each .mlpackage folder


@dataclass(frozen=True)
class ExportSpec:
    """What a package was built for (also stored as JSON inside the package)."""

    kind: str  # "hubert" | "bert"
    precision: str  # "fp16" | "fp32"
    buckets: tuple[int, ...]  # samples (hubert) or tokens (bert)
    args: dict[str, Any]
    pad_id: int = 0  # bert only
    version: int = EXPORT_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "precision": self.precision,
            "buckets": list(self.buckets),
            "args": self.args,
            "pad_id": self.pad_id,
            "version": self.version,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExportSpec:
        return cls(d["kind"], d["precision"], tuple(int(b) for b in d["buckets"]), dict(d["args"]),
                   int(d.get("pad_id", 0)), int(d.get("version", 0)))


def _ct():
    """Import coremltools quietly (on Linux it prints 'Failed to load ...' lines for the missing
    prediction library, which is expected there). Raises ImportError when it is not installed."""
    mod = sys.modules.get("coremltools")
    if mod is not None:
        return mod
    stderr = sys.stderr
    try:
        with open(os.devnull, "w") as devnull:
            sys.stderr = devnull
            import coremltools
    finally:
        sys.stderr = stderr
    return coremltools


def _f32(a) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32))


def _linear_as_conv(w: np.ndarray) -> np.ndarray:
    """Linear weight (out, in) -> 1x1 conv weight (out, in, 1, 1)."""
    return _f32(w)[:, :, None, None]


def _conv1d_as_conv2d(w: np.ndarray) -> np.ndarray:
    """MLX conv1d weight (out, K, in/groups) -> MIL conv2d weight (out, in/groups, 1, K)."""
    return _f32(np.transpose(w, (0, 2, 1)))[:, :, None, :]


# ---------------------------------------------------------------------------------------------------
# shared blocks (x is (1, C, 1, S) channels-first)
# ---------------------------------------------------------------------------------------------------


def _conv1x1(mb, x, w, b, name):
    return mb.conv(x=x, weight=_linear_as_conv(w), bias=None if b is None else _f32(b), name=name)


def _layer_norm(mb, x, w, b, eps, name):
    return mb.layer_norm(x=x, axes=[1], gamma=_f32(w), beta=_f32(b), epsilon=float(eps), name=name)


def _attention(mb, x, key_bias, p: dict[str, np.ndarray], names: tuple[str, str, str, str], n_heads: int, prefix):
    """Multi-head self-attention on (1, D, 1, S); ``key_bias`` (1, 1, 1, S) is added to the scores."""
    qn, kn, vn, on = names
    d = p[qn + ".weight"].shape[0]
    hd = d // n_heads
    scale = hd**-0.5
    q = _conv1x1(mb, x, p[qn + ".weight"] * scale, p[qn + ".bias"] * scale, prefix + "q")
    k = _conv1x1(mb, x, p[kn + ".weight"], p[kn + ".bias"], prefix + "k")
    v = _conv1x1(mb, x, p[vn + ".weight"], p[vn + ".bias"], prefix + "v")
    shape = [1, n_heads, hd, -1]
    q = mb.reshape(x=q, shape=shape, name=prefix + "q_heads")
    k = mb.reshape(x=k, shape=shape, name=prefix + "k_heads")
    v = mb.reshape(x=v, shape=shape, name=prefix + "v_heads")
    scores = mb.matmul(x=q, y=k, transpose_x=True, transpose_y=False, name=prefix + "scores")  # (1,H,Sq,Sk)
    scores = mb.add(x=scores, y=key_bias, name=prefix + "masked_scores")
    probs = mb.softmax(x=scores, axis=-1, name=prefix + "probs")
    o = mb.matmul(x=v, y=probs, transpose_x=False, transpose_y=True, name=prefix + "context")  # (1,H,hd,Sq)
    o = mb.reshape(x=o, shape=[1, d, 1, -1], name=prefix + "context_flat")
    return _conv1x1(mb, o, p[on + ".weight"], p[on + ".bias"], prefix + "out")


def _ffn(mb, x, up_w, up_b, down_w, down_b, prefix):
    h = _conv1x1(mb, x, up_w, up_b, prefix + "up")
    h = mb.gelu(x=h, mode="EXACT", name=prefix + "gelu")
    return _conv1x1(mb, h, down_w, down_b, prefix + "down")


def _length_mask(mb, like, n_valid, axis: int, name: str):
    """float32 (1, 1, 1, S) mask: 1 for positions < n_valid along ``axis`` of ``like`` (S may be symbolic)."""
    s = mb.slice_by_index(x=mb.shape(x=like), begin=[axis], end=[axis + 1], name=name + "_len")
    pos = mb.range_1d(start=np.int32(0), end=mb.squeeze(x=s), step=np.int32(1), name=name + "_pos")
    m = mb.cast(x=mb.less(x=pos, y=n_valid), dtype="fp32", name=name + "_bool")
    return mb.reshape(x=m, shape=[1, 1, 1, -1], name=name), mb.cast(x=s, dtype="fp32")


# ---------------------------------------------------------------------------------------------------
# HuBERT
# ---------------------------------------------------------------------------------------------------


def hubert_program(weights: dict[str, np.ndarray], args):
    """MIL program of CNHubert (``last_hidden_state``) from sanitized weights and ``HubertArgs``.

    The ``wav`` length is symbolic (the EnumeratedShapes are attached at conversion). Why padding gives the
    unpadded result:

    * conv stack: output frame t of every conv only reads input frames of the same layer that are themselves
      valid, so the valid frames never see the padding — except through the GroupNorm after conv 0, which
      normalises over time: its mean/variance are taken over the valid frames only (masked ``reduce_mean``
      rescaled by T_bucket / n_valid; ``reduce_mean`` keeps fp16 sums small).
    * the positional conv ("same" padding) would read padded frames at the end: its input is zeroed there.
    * attention: padded keys get -1e4 added to their scores (exp underflows to exactly 0 in fp32 and fp16).
    * everything else is per frame."""
    ct = _ct()
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import get_new_symbol

    p = weights
    n_sym = get_new_symbol()
    specs = [mb.TensorSpec(shape=(1, n_sym), dtype=ct.converters.mil.mil.types.fp32),
             mb.TensorSpec(shape=(1,), dtype=ct.converters.mil.mil.types.int32)]
    eps = float(args.layer_norm_eps)

    @mb.program(input_specs=specs, opset_version=ct.target.macOS14)
    def prog(wav, num_samples):
        x = mb.reshape(x=wav, shape=[1, 1, 1, -1], name="wav4d")
        n = num_samples
        for i, (k, s) in enumerate(zip(args.conv_kernel, args.conv_stride)):
            pre = f"fe{i}_"
            w = p[f"feature_extractor.conv_layers.{i}.conv.weight"]
            b = p.get(f"feature_extractor.conv_layers.{i}.conv.bias")
            x = mb.conv(x=x, weight=_conv1d_as_conv2d(w), bias=None if b is None else _f32(b),
                        strides=[1, int(s)], pad_type="valid", name=pre + "conv")
            # valid frames after this conv: (n - k) // s + 1
            n = mb.add(x=mb.floor_div(x=mb.sub(x=n, y=np.int32(k)), y=np.int32(s)), y=np.int32(1), name=pre + "n")
            if i == 0:  # GroupNorm(C, C): per channel over the valid frames only
                m, t_len = _length_mask(mb, x, n, 3, pre + "mask")
                ratio = mb.real_div(x=t_len, y=mb.cast(x=n, dtype="fp32"), name=pre + "ratio")
                ratio = mb.reshape(x=ratio, shape=[1, 1, 1, 1])
                mean = mb.mul(x=mb.reduce_mean(x=mb.mul(x=x, y=m), axes=[3], keep_dims=True), y=ratio)
                xc = mb.sub(x=x, y=mean, name=pre + "centered")
                xm = mb.mul(x=xc, y=m)
                var = mb.mul(x=mb.reduce_mean(x=mb.mul(x=xm, y=xm), axes=[3], keep_dims=True), y=ratio)
                inv = mb.rsqrt(x=var, epsilon=1e-5, name=pre + "inv_std")
                gamma = _f32(p[f"feature_extractor.conv_layers.{i}.layer_norm.weight"])[None, :, None, None]
                beta = _f32(p[f"feature_extractor.conv_layers.{i}.layer_norm.bias"])[None, :, None, None]
                x = mb.add(x=mb.mul(x=mb.mul(x=xc, y=inv), y=gamma), y=beta, name=pre + "norm")
            x = mb.gelu(x=x, mode="EXACT", name=pre + "gelu")
        frame_mask, _ = _length_mask(mb, x, n, 3, "frame_mask")
        key_bias = mb.mul(x=mb.sub(x=frame_mask, y=np.float32(1.0)), y=np.float32(-MASK_NEG), name="key_bias")
        x = _layer_norm(mb, x, p["feature_projection.layer_norm.weight"], p["feature_projection.layer_norm.bias"],
                        eps, "fp_norm")
        proj = _conv1x1(mb, x, p["feature_projection.projection.weight"], p["feature_projection.projection.bias"],
                        "fp_proj")
        # positional conv on the zero-padded projection (the unpadded run pads with zeros too)
        K, G = int(args.num_conv_pos_embeddings), int(args.num_conv_pos_embedding_groups)
        pc = mb.mul(x=proj, y=frame_mask, name="pos_in")
        pc = mb.conv(x=pc, weight=_conv1d_as_conv2d(p["encoder.pos_conv_embed.conv.weight"]),
                     bias=_f32(p["encoder.pos_conv_embed.conv.bias"]), strides=[1, 1], pad_type="custom",
                     pad=[0, 0, K // 2, K // 2], groups=G, name="pos_conv")
        if K % 2 == 0:
            pc = mb.slice_by_index(x=pc, begin=[0, 0, 0, 0], end=[0, 0, 0, -1],
                                   end_mask=[True, True, True, False], name="pos_conv_crop")
        pc = mb.gelu(x=pc, mode="EXACT", name="pos_gelu")
        x = _layer_norm(mb, mb.add(x=proj, y=pc), p["encoder.layer_norm.weight"], p["encoder.layer_norm.bias"],
                        eps, "enc_norm")
        for li in range(int(args.num_hidden_layers)):
            pre = f"encoder.layers.{li}."
            names = tuple(pre + f"attention.{n}_proj" for n in ("q", "k", "v", "out"))
            a = _attention(mb, x, key_bias, p, names, int(args.num_attention_heads), f"l{li}_att_")
            x = _layer_norm(mb, mb.add(x=x, y=a), p[pre + "layer_norm.weight"], p[pre + "layer_norm.bias"], eps,
                            f"l{li}_ln1")
            f = _ffn(mb, x, p[pre + "feed_forward.intermediate_dense.weight"],
                     p[pre + "feed_forward.intermediate_dense.bias"], p[pre + "feed_forward.output_dense.weight"],
                     p[pre + "feed_forward.output_dense.bias"], f"l{li}_ffn_")
            name = "last_hidden_state" if li == args.num_hidden_layers - 1 else f"l{li}_out"
            x = _layer_norm(mb, mb.add(x=x, y=f), p[pre + "final_layer_norm.weight"],
                            p[pre + "final_layer_norm.bias"], eps, name)
        if int(args.num_hidden_layers) == 0:
            x = mb.identity(x=x, name="last_hidden_state")
        return x

    return prog


# ---------------------------------------------------------------------------------------------------
# BERT
# ---------------------------------------------------------------------------------------------------


def bert_program(weights: dict[str, np.ndarray], args, pad_id: int = 0):
    """MIL program of the Chinese RoBERTa up to ``hidden_states[-3]`` from sanitized weights and
    ``BertArgs``. The token count is symbolic (EnumeratedShapes attached at conversion)."""
    ct = _ct()
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import get_new_symbol

    p = weights
    eps = float(args.layer_norm_eps)
    # position + token-type row 0 are input-independent: one constant table, sliced to L in-graph
    pos_tt = _f32(p["embeddings.position_embeddings.weight"] + p["embeddings.token_type_embeddings.weight"][0])
    specs = [mb.TensorSpec(shape=(1, get_new_symbol()), dtype=ct.converters.mil.mil.types.int32)]

    @mb.program(input_specs=specs, opset_version=ct.target.macOS14)
    def prog(input_ids):
        valid = mb.cast(x=mb.not_equal(x=input_ids, y=np.int32(pad_id)), dtype="fp32", name="attention_mask")
        valid = mb.reshape(x=valid, shape=[1, 1, 1, -1])
        key_bias = mb.mul(x=mb.sub(x=valid, y=np.float32(1.0)), y=np.float32(-MASK_NEG), name="key_bias")
        L = mb.squeeze(x=mb.slice_by_index(x=mb.shape(x=input_ids), begin=[1], end=[2]), name="num_tokens")
        positions = mb.range_1d(start=np.int32(0), end=L, step=np.int32(1), name="positions")
        ids = mb.squeeze(x=input_ids, axes=[0], name="ids")
        x = mb.gather(x=_f32(p["embeddings.word_embeddings.weight"]), indices=ids, axis=0, name="word_emb")
        x = mb.add(x=x, y=mb.gather(x=pos_tt, indices=positions, axis=0), name="emb_sum")  # (L, H)
        x = mb.reshape(x=mb.transpose(x=x, perm=[1, 0]), shape=[1, int(args.hidden_size), 1, -1], name="emb_4d")
        x = _layer_norm(mb, x, p["embeddings.norm.weight"], p["embeddings.norm.bias"], eps, "emb_norm")
        n = int(args.num_layers_run)
        for li in range(n):
            pre = f"layers.{li}."
            names = tuple(pre + f"attention.{k}" for k in ("query", "key", "value", "out"))
            a = _attention(mb, x, key_bias, p, names, int(args.num_attention_heads), f"l{li}_att_")
            x = _layer_norm(mb, mb.add(x=x, y=a), p[pre + "attention_norm.weight"], p[pre + "attention_norm.bias"],
                            eps, f"l{li}_ln1")
            f = _ffn(mb, x, p[pre + "ffn.up.weight"], p[pre + "ffn.up.bias"], p[pre + "ffn.down.weight"],
                     p[pre + "ffn.down.bias"], f"l{li}_ffn_")
            x = _layer_norm(mb, mb.add(x=x, y=f), p[pre + "ffn_norm.weight"], p[pre + "ffn_norm.bias"], eps,
                            "hidden" if li == n - 1 else f"l{li}_out")
        if n == 0:
            x = mb.identity(x=x, name="hidden")
        return x

    return prog


# ---------------------------------------------------------------------------------------------------
# conversion and packages
# ---------------------------------------------------------------------------------------------------


def hubert_buckets(buckets: Sequence[int] | None = None) -> tuple[int, ...]:
    return tuple(sorted({int(b) for b in (buckets or HUBERT_BUCKETS)}))


def token_buckets(max_positions: int, buckets: Sequence[int] | None = None) -> tuple[int, ...]:
    """Token buckets that fit the position table; the largest bucket is the table size when the
    standard buckets stop short of it (e.g. 128 for a tiny model, 512 for the real RoBERTa)."""
    chosen = sorted({int(b) for b in (buckets or TOKEN_BUCKETS) if int(b) <= max_positions})
    if not chosen or chosen[-1] < max_positions <= max(buckets or TOKEN_BUCKETS):
        chosen.append(int(max_positions))
    return tuple(chosen)


def _convert(prog, inputs, precision: str):
    """The ML Program of ``prog`` (macOS 14 target, ``precision`` fp16 or fp32).

    The programs are written in the Neural Engine's layout (docs/coreml.md, "The Neural Engine layout"): activations are
    (1, C, 1, S) channels-first, every Linear is a 1x1 ``conv``, LayerNorm runs over axis 1, attention reshapes
    channels into (1, heads, head_dim, S) and uses two ``matmul`` with transpose flags (no transpose ops); the
    softmax scale is folded into the query weights. Only ``input_ids``/``wav`` bucket shapes are enumerated
    (EnumeratedShapes compile per shape for the ANE, RangeDim would run off-ANE except for its default)."""
    ct = _ct()
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: use one of {', '.join(PRECISIONS)}")
    cp = ct.precision.FLOAT16 if precision == "fp16" else ct.precision.FLOAT32
    # No int16 casts: they would wrap the frame counts of long waveforms (33919 conv-0 frames for the
    # 10.6 s bucket > 32767) and empty the masks derived from them.
    pipeline = ct.PassPipeline.DEFAULT
    pipeline.remove_passes({"common::add_int16_cast"})
    return ct.convert(
        prog,
        convert_to="mlprogram",
        inputs=inputs,
        compute_precision=cp,
        minimum_deployment_target=ct.target.macOS14,
        compute_units=ct.ComputeUnit.CPU_AND_NE,
        pass_pipeline=pipeline,
    )


def convert_hubert(weights, args, precision: str = "fp16", buckets: Sequence[int] | None = None):
    """In-memory ``ct.models.MLModel`` (not loaded for prediction on Linux) of CNHubert.

    Inputs ``wav`` float32 (1, N) with N one of :data:`HUBERT_BUCKETS` (EnumeratedShapes; 3..10 s plus the 0.6 s
    zero tail, 16000-sample steps) and ``num_samples`` int32 (1,) (fixed shape: how many leading samples are real;
    the rest is zero padding). Output ``last_hidden_state`` float32 (1, hidden, 1, T_bucket) — channels-first,
    PyTorch's (B, C, T) plus a unit axis. Frames ``>= num_frames(num_samples)`` are padding: the caller crops them."""
    ct = _ct()
    buckets = hubert_buckets(buckets)
    too_short = [b for b in buckets if args.num_frames(b) < 1]
    if too_short:
        raise ValueError(f"HuBERT buckets {too_short} are shorter than the receptive field {args.receptive_field}")
    prog = hubert_program(weights, args)
    inputs = [
        ct.TensorType(name="wav", shape=ct.EnumeratedShapes(shapes=[(1, b) for b in buckets], default=(1, buckets[0])),
                      dtype=np.float32),
        ct.TensorType(name="num_samples", shape=(1,), dtype=np.int32),
    ]
    model = _convert(prog, inputs, precision)
    spec = ExportSpec("hubert", precision, buckets, args.to_dict())
    _describe(model, spec)
    return model, spec


def convert_bert(weights, args, precision: str = "fp16", buckets: Sequence[int] | None = None, pad_id: int = 0):
    """In-memory ``ct.models.MLModel`` (not loaded for prediction on Linux) of the Chinese RoBERTa.

    Input ``input_ids`` int32 (1, L), L one of the token buckets (16..512, capped at ``max_position_embeddings``),
    padded with the tokenizer's pad id. The attention mask is derived in-graph (``input_ids != pad_id``) so one
    flexible input suffices (a macOS 14 target; two enumerated inputs would need macOS 15). Output ``hidden``
    float32 (1, hidden, 1, L) = ``hidden_states[-3]`` channels-first; padded columns are cropped by the caller."""
    ct = _ct()
    buckets = token_buckets(int(args.max_position_embeddings), buckets)
    prog = bert_program(weights, args, pad_id=pad_id)
    inputs = [
        ct.TensorType(name="input_ids",
                      shape=ct.EnumeratedShapes(shapes=[(1, b) for b in buckets], default=(1, buckets[0])),
                      dtype=np.int32),
    ]
    model = _convert(prog, inputs, precision)
    spec = ExportSpec("bert", precision, buckets, args.to_dict(), pad_id=int(pad_id))
    _describe(model, spec)
    return model, spec


def _describe(model, spec: ExportSpec) -> None:
    model.short_description = f"dora-primespeech-mlx {spec.kind} encoder ({spec.precision})"
    model.user_defined_metadata["primespeech_export"] = json.dumps(spec.to_dict())


def save_package(model, spec: ExportSpec, path: str | os.PathLike) -> Path:
    """Write ``model`` to ``path`` (.mlpackage) atomically, with the :class:`ExportSpec` JSON inside."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        pkg = tmp / path.name
        model.save(str(pkg))
        (pkg / PACKAGE_META).write_text(json.dumps(spec.to_dict(), indent=2), encoding="utf-8")
        if path.exists():
            shutil.rmtree(path)
        os.replace(pkg, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def read_package_spec(path: str | os.PathLike) -> ExportSpec:
    """The :class:`ExportSpec` stored in a package written by :func:`save_package`."""
    f = Path(path) / PACKAGE_META
    try:
        return ExportSpec.from_dict(json.loads(f.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"{path}: not a dora-primespeech-mlx CoreML package ({exc})") from None


def load_weights(path: str | os.PathLike, kind: str, root: Path | None = None):
    """(args, sanitized float32 weights, pad_id) of an original or converted HuBERT/BERT folder. No torch,
    no MLX model is built: an original folder goes through ``read_original`` + ``sanitized``."""
    path = Path(path)
    if kind not in ("hubert", "bert"):
        raise ValueError(f"CoreML export supports 'hubert' and 'bert', not {kind!r}")
    if load.is_converted(path):
        from safetensors.numpy import load_file

        meta = json.loads((path / "config.json").read_text(encoding="utf-8"))
        if meta.get("kind") != kind:
            raise ValueError(f"{path} holds a {meta.get('kind')} model, expected {kind}")
        args_cls, _ = load._model_classes(kind)
        args = args_cls(**meta["args"])
        weights = load_file(str(path / "model.safetensors"))
    else:
        args, weights = load.sanitized(load.read_original(path, kind))
    pad_id = 0
    if kind == "bert":
        from ..models.bert.model import BertTokenizer

        try:
            pad_id = BertTokenizer.from_dir(path).pad_id
        except FileNotFoundError:
            pad_id = 0
    return args, weights, pad_id


def export_encoder(src: str | os.PathLike, kind: str, out: str | os.PathLike, precision: str = "fp16",
                   buckets: Sequence[int] | None = None) -> Path:
    """Build and save the ``.mlpackage`` of one encoder from an original or converted model folder."""
    args, weights, pad_id = load_weights(src, kind)
    if kind == "hubert":
        model, spec = convert_hubert(weights, args, precision, buckets)
    else:
        model, spec = convert_bert(weights, args, precision, buckets, pad_id=pad_id)
    return save_package(model, spec, out)


def package_path(src: str | os.PathLike, kind: str, precision: str, root: Path) -> Path:
    """Cache location of the package for a source model: ``<root>/coreml/<kind>-<name>-<digest>-<prec>`` (``root``:
    the model directory; the digest covers the source path, its size/mtime and :data:`EXPORT_VERSION`)."""
    src = Path(src).resolve()
    files = sorted(p for p in src.iterdir() if p.is_file()) if src.is_dir() else [src]
    stamp = "|".join(f"{p.name}:{p.stat().st_size}:{int(p.stat().st_mtime)}" for p in files)
    digest = hashlib.sha1(f"{src}|{stamp}|{EXPORT_VERSION}".encode()).hexdigest()[:12]
    return Path(root) / "coreml" / f"{kind}-{src.name}-{digest}-{precision}.mlpackage"


def ensure_package(src: str | os.PathLike, kind: str, precision: str, root: Path) -> Path:
    """The cached package for ``src`` (exported the first time; later calls only check it exists)."""
    path = package_path(src, kind, precision, root)
    if path.is_dir() and (path / PACKAGE_META).is_file():
        return path
    log.info("exporting the %s encoder %s to CoreML (%s), once", kind, src, precision)
    return export_encoder(src, kind, path, precision)


def export_voice_encoders(spec, root: Path, precision: str = "fp16") -> dict[str, Path]:
    """Export (once, cached) the HuBERT and BERT packages a voice uses; for voice installation on macOS."""
    from tqdm import tqdm

    out = {}
    for kind in tqdm(("hubert", "bert"), desc=f"CoreML encoders for {getattr(spec, 'name', 'voice')}", unit="model"):
        out[kind] = ensure_package(getattr(spec, kind), kind, precision, root)
    return out
