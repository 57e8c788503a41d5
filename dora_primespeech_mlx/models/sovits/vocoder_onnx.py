"""The SoVITS generator (HiFi-GAN vocoder) on ONNX Runtime, for CPU-only machines.

Why: on the CPU, MLX runs the generator's convolutions through this package's GEMM path, well below the
machine's sgemm peak and on one core; ONNX Runtime's MLAS convolutions run every layer shape of the v2 generator
close to that peak and use the configured threads (docs/performance.md, "The SoVITS vocoder on ONNX Runtime").

The ONNX graph is built **without torch** from the loaded :class:`~.hifigan.Generator`'s weights with the
``onnx`` helper API (:func:`build_generator_model`): the same operations in the same order as
``Generator.__call__``, in ONNX's (B, C, T) layout, batch and time dynamic. It is cached on disk under a
name derived from a digest of the weights and of this builder's version (:func:`load_or_build`), written
atomically, so it is built once per model and never half-read. :class:`OnnxGenerator` is what the SoVITS model
calls: ``generator(z, ge) -> audio`` with numpy arrays; choosing it (and falling back to MLX on any failure) is
:mod:`.vocoder`'s job."""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ... import _blas

log = logging.getLogger(__name__)

BUILDER_VERSION = 2  # bump when the graph changes: the cache name changes with it
OPSET = 17
LRELU_SLOPE = 0.1
POST_SLOPE = 0.01


def _np(a) -> np.ndarray:
    return np.ascontiguousarray(np.array(a, dtype=np.float32))


def _conv_weight(conv) -> np.ndarray:
    """MLX Conv1d weight (Co, K, Ci) -> ONNX Conv weight (Co, Ci, K)."""
    return _np(conv.weight).transpose(0, 2, 1).copy()


def _convt_weight(conv) -> np.ndarray:
    """MLX transposed-conv weight (Co, K, Ci) -> ONNX ConvTranspose weight (Ci, Co, K)."""
    return _np(conv.weight).transpose(2, 0, 1).copy()


def generator_weights(dec) -> dict[str, np.ndarray]:
    """Every weight the graph uses, in ONNX layout, named after the module paths."""
    out: dict[str, np.ndarray] = {}

    def conv(name, module):
        out[f"{name}.weight"] = _conv_weight(module)
        if "bias" in module:
            out[f"{name}.bias"] = _np(module.bias)

    conv("conv_pre", dec.conv_pre)
    conv("cond", dec.cond)
    for i, up in enumerate(dec.ups):
        out[f"ups.{i}.weight"] = _convt_weight(up)
        out[f"ups.{i}.bias"] = _np(up.bias)
    for j, block in enumerate(dec.resblocks):
        for n, (c1, c2) in enumerate(zip(block.convs1, block.convs2)):
            conv(f"resblocks.{j}.convs1.{n}", c1)
            conv(f"resblocks.{j}.convs2.{n}", c2)
    conv("conv_post", dec.conv_post)
    return out


def weights_digest(weights: dict[str, np.ndarray], layout: str = "2d") -> str:
    h = hashlib.sha256(f"sovits-generator-onnx/{BUILDER_VERSION}/{OPSET}/{layout}".encode())
    for name in sorted(weights):
        w = weights[name]
        h.update(f"{name}:{w.shape}".encode())
        h.update(w.tobytes())
    return h.hexdigest()[:20]


class _Graph:
    """A tiny builder over ``onnx.helper``: initializers, nodes with generated output names.

    With ``conv2d`` every 1-D convolution is written as a 2-D one over (B, C, 1, T) with (1, K) kernels:
    ONNX Runtime's NCHWc convolution kernels (its layout transformer handles 4-D convs only) then run
    them, measured faster than its 1-D im2col path on this generator at one thread (at two or more the 1-D graph
    is faster: :func:`layout_for`; README, "Performance")."""

    def __init__(self, weights: dict[str, np.ndarray], conv2d: bool = True):
        from onnx import numpy_helper

        self.conv2d = conv2d
        self.nodes: list[Any] = []
        self.initializers = [
            numpy_helper.from_array(w[:, :, None, :] if conv2d and w.ndim == 3 else w, name)
            for name, w in weights.items()
        ]
        self.names = set(weights)
        self._n = 0

    def _dims(self, values: list[int], pad: bool = False) -> list[int]:
        """1-D attribute values -> the graph's layout (a unit height first for 2-D)."""
        if not self.conv2d:
            return values
        return [0, values[0], 0, values[1]] if pad else [1, *values]

    def const(self, name: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype=np.float32), name))
        self.names.add(name)
        return name

    def const_int(self, name: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype=np.int64), name))
        self.names.add(name)
        return name

    def op(self, op_type: str, inputs: list[str], **attrs) -> str:
        from onnx import helper

        self._n += 1
        out = f"{op_type.lower()}_{self._n}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=f"n{self._n}", **attrs))
        return out

    def conv(self, x: str, name: str, kernel: int, padding: int = 0, dilation: int = 1) -> str:
        inputs = [x, f"{name}.weight"] + ([f"{name}.bias"] if f"{name}.bias" in self.names else [])
        return self.op("Conv", inputs, kernel_shape=self._dims([kernel]), pads=self._dims([padding, padding], True),
                       dilations=self._dims([dilation]), strides=self._dims([1]))

    def conv_transpose(self, x: str, name: str, kernel: int, stride: int, padding: int) -> str:
        return self.op("ConvTranspose", [x, f"{name}.weight", f"{name}.bias"], kernel_shape=self._dims([kernel]),
                       strides=self._dims([stride]), pads=self._dims([padding, padding], True))

    def lrelu(self, x: str, slope: float) -> str:
        return self.op("LeakyRelu", [x], alpha=float(slope))


def build_generator_model(dec, weights: dict[str, np.ndarray] | None = None, layout: str = "2d"):
    """An ``onnx.ModelProto`` computing ``dec(z, g)``: inputs ``z`` (B, inter, T) and ``g`` (B, gin, 1),
    output ``audio`` (B, 1, T * hop). ``layout``: ``2d`` (convolutions over (B, C, 1, T), the default) or
    ``1d``."""
    from onnx import TensorProto, checker, helper

    if layout not in ("1d", "2d"):
        raise ValueError(f"layout {layout!r}: expected '1d' or '2d'")
    weights = generator_weights(dec) if weights is None else weights
    g = _Graph(weights, conv2d=layout == "2d")
    c_in = weights["conv_pre.weight"].shape[1]
    gin = weights["cond.weight"].shape[1]
    z, cond = "z", "g"
    if g.conv2d:
        axis = g.const_int("height_axis", np.array([2], dtype=np.int64))
        z, cond = g.op("Unsqueeze", ["z", axis]), g.op("Unsqueeze", ["g", axis])
    x = g.conv(z, "conv_pre", weights["conv_pre.weight"].shape[2], padding=3)
    x = g.op("Add", [x, g.conv(cond, "cond", 1)])
    n = dec.num_kernels
    inv_n = g.const("inv_num_kernels", np.array(1.0 / n, dtype=np.float32)) if n > 1 else None
    for i, up in enumerate(dec.ups):
        x = g.lrelu(x, LRELU_SLOPE)
        x = g.conv_transpose(x, f"ups.{i}", up.kernel_size, up.stride, up.padding)
        acc = None
        for j in range(n):
            index = i * n + j
            block = dec.resblocks[index]
            y = x
            for m, c1 in enumerate(block.convs1):
                k = weights[f"resblocks.{index}.convs1.{m}.weight"].shape[2]
                t = g.lrelu(y, LRELU_SLOPE)
                t = g.conv(t, f"resblocks.{index}.convs1.{m}", k, padding=c1.padding[0], dilation=c1.dilation)
                t = g.lrelu(t, LRELU_SLOPE)
                t = g.conv(t, f"resblocks.{index}.convs2.{m}", k, padding=(k - 1) // 2)
                y = g.op("Add", [y, t])
            acc = y if acc is None else g.op("Add", [acc, y])
        x = g.op("Mul", [acc, inv_n]) if inv_n else acc
    x = g.lrelu(x, POST_SLOPE)
    x = g.conv(x, "conv_post", weights["conv_post.weight"].shape[2], padding=3)
    x = g.op("Tanh", [x])
    if g.conv2d:
        x = g.op("Squeeze", [x, axis])
    g.nodes[-1].output[0] = "audio"
    graph = helper.make_graph(
        g.nodes,
        "sovits_generator",
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["B", c_in, "T"]),
         helper.make_tensor_value_info("g", TensorProto.FLOAT, ["B", gin, 1])],
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["B", 1, "S"])],
        g.initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="dora_primespeech_mlx")
    model.ir_version = min(model.ir_version, 8)  # opset 17 needs IR 8; older runtimes refuse newer IRs
    checker.check_model(model)
    return model


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def resolve_threads(threads: int | None = None) -> int:
    """ONNX Runtime intra-op threads: ``threads``, else the package's BLAS thread setting
    (``PRIMESPEECH_THREADS``, default 1 on machines with <= 2 CPUs), else 0 (ONNX Runtime's default)."""
    if threads is not None:
        return max(1, int(threads))
    n = _blas.thread_settings().get("blas_threads")
    return n if isinstance(n, int) and n > 0 else 0


def layout_for(threads: int) -> str:
    """The graph layout for ``threads`` intra-op threads (0: ONNX Runtime's default, all cores): ``2d`` (NCHWc
    kernels) for one thread, ``1d`` (im2col + its threaded GEMM) for more, the faster of the two at each
    (docs/performance.md, "The SoVITS vocoder on ONNX Runtime")."""
    return "2d" if threads == 1 else "1d"


def generator_inputs(z, ge) -> dict[str, np.ndarray]:
    """The graph's inputs ``z`` (B, C, T) and ``g`` (B, gin, 1) as contiguous float32, ``ge`` broadcast over the
    batch; ValueError on other ranks."""
    z = np.ascontiguousarray(z, dtype=np.float32)
    ge = np.ascontiguousarray(ge, dtype=np.float32)
    if z.ndim != 3 or ge.ndim != 3:
        raise ValueError(f"generator input shapes {z.shape}, {ge.shape}: expected (B, C, T) and (B, gin, 1)")
    if ge.shape[0] != z.shape[0]:
        ge = np.broadcast_to(ge, (z.shape[0], *ge.shape[1:])).copy()
    return {"z": z, "g": ge}


class OnnxGenerator:
    """The generator as an ONNX Runtime session. ``__call__(z, ge)`` with numpy float32 arrays."""

    def __init__(self, model: str | os.PathLike | bytes, threads: int | None = None, arena: bool = False,
                 spin: bool | None = None):
        import onnxruntime as ort

        self.threads = resolve_threads(threads)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        # Spinning worker threads collapse when a neighbour process takes a core (docs/performance.md, "Spinning
        # intra-op threads"); they only wait when idle.
        self.spin = bool(spin)  # None: off
        opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if self.spin else "0")
        # No CPU memory arena: the arena keeps every activation buffer of the largest decode so far; plain
        # allocations go back to the heap/OS, for a small cost per decode (docs/memory.md, "The levers").
        self.arena = bool(arena)
        opts.enable_cpu_mem_arena = self.arena
        source = model if isinstance(model, bytes) else str(model)
        self.session = ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])
        self.path = None if isinstance(model, bytes) else Path(model)
        self.onnxruntime_version = ort.__version__
        self.digest: str | None = None  # set by load_or_build
        self.layout = "2d"

    def __call__(self, z: np.ndarray, ge: np.ndarray) -> np.ndarray:
        (audio,) = self.session.run(["audio"], generator_inputs(z, ge))
        return audio

    def describe(self) -> dict[str, Any]:
        return {"threads": self.threads, "layout": self.layout, "onnxruntime": self.onnxruntime_version,
                "arena": self.arena, "spin": self.spin,
                "path": None if self.path is None else str(self.path)}


def cache_file(cache_dir: Path, digest: str) -> Path:
    return Path(cache_dir) / f"sovits-generator-{digest}.onnx"


def load_or_build(
    dec, cache_dir: str | os.PathLike | None, threads: int | None = None, layout: str | None = None,
    spin: bool | None = None, factory=None, arena: bool = False,
):
    """The generator ``dec`` on ONNX Runtime (an :class:`OnnxGenerator`): from ``cache_dir`` when its graph is
    already there, else built, written there atomically and loaded. With ``cache_dir`` None (or not writable) the
    graph is built in memory. ``layout`` None: the one for the thread count (:func:`layout_for`). ``spin``,
    ``arena``: see :class:`OnnxGenerator`. ``factory(model)``: another runtime's generator from the graph (a path or
    bytes) instead (:func:`.vocoder_openvino.load_or_build`)."""
    if layout is None:
        layout = layout_for(resolve_threads(threads))
    if factory is None:
        def factory(model):
            return OnnxGenerator(model, threads, arena=arena, spin=spin)
    weights = generator_weights(dec)
    digest = weights_digest(weights, layout)
    gen = _load_or_build(dec, weights, digest, cache_dir, layout, factory)
    gen.digest, gen.layout = digest, layout  # what the graph was built from (vocoder.MLXWeights checks it)
    return gen


def _load_or_build(dec, weights, digest: str, cache_dir, layout: str, factory):
    path = cache_file(Path(cache_dir), digest) if cache_dir is not None else None
    if path is not None and path.is_file():
        try:
            return factory(path)
        except Exception as exc:  # a damaged cache file: rebuild it
            log.warning("cached vocoder graph %s unusable (%s); rebuilding", path, exc)
    data = build_generator_model(dec, weights, layout).SerializeToString()
    del weights
    if path is not None:
        try:
            _write_atomic(path, data)
            return factory(path)
        except OSError as exc:
            log.warning("cannot cache the vocoder graph in %s (%s); keeping it in memory", path.parent, exc)
    return factory(data)
