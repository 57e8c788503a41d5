"""Which CPU conv kernels can run the SoVITS vocoder fast? One layer of each real shape, every candidate, one run.

``python -m dora_primespeech_mlx.bench.conv [--threads N] [--frames 200] [--repeat 5]``

The HiFi-GAN generator of GPT-SoVITS v2 (upsample 512 ch, rates 10/8/2/2/2, kernels 16/16/8/2/2,
ResBlock1 kernels 3/7/11 x dilations 1/3/5) spends its time in a few layer shapes. For ``--frames``
latent frames (200 = 4 s of audio at 32 kHz) this times one layer of each shape on MLX's own convolutions, this
package's GEMM formulations (``models/sovits/conv.py``), ONNX Runtime (1-D and the 2-D graph
``models/sovits/vocoder_onnx.py`` builds), OpenVINO and numpy's im2col GEMM alone (a lower bound for any GEMM
formulation), and reports ms and GFLOP/s next to the machine's sgemm peak (numpy 2048^3 matmul), with ``--threads``
threads for each. Missing candidates are reported as such. Not a test; numbers depend on the load of the machine
(the 1-minute loadavg is printed). Results: docs/performance.md, "The SoVITS vocoder on ONNX Runtime"."""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass


@dataclass
class Layer:
    name: str
    c_in: int
    c_out: int
    kernel: int
    length: int  # input frames
    dilation: int = 1
    stride: int = 1  # the upsampling factor for transposed convs
    transpose: bool = False

    @property
    def padding(self) -> int:
        if self.transpose:
            return (self.kernel - self.stride) // 2
        return self.dilation * (self.kernel - 1) // 2

    @property
    def out_length(self) -> int:
        if self.transpose:
            return (self.length - 1) * self.stride + self.kernel - 2 * self.padding
        return self.length + 2 * self.padding - self.dilation * (self.kernel - 1)

    @property
    def flops(self) -> float:
        if self.transpose:
            return 2.0 * self.length * self.c_in * self.c_out * self.kernel
        return 2.0 * self.out_length * self.c_in * self.c_out * self.kernel

    def gemm_shape(self) -> tuple[int, int, int]:
        """(M, K, N) of the layer as one GEMM."""
        if self.transpose:
            return self.length, self.c_in, self.kernel * self.c_out
        return self.out_length, self.kernel * self.c_in, self.c_out


def generator_layers(frames: int) -> list[Layer]:
    """One layer of each shape of the v2 generator for ``frames`` latent frames."""
    t0, t1, t2, t3, t4 = frames * 10, frames * 80, frames * 160, frames * 320, frames * 640
    return [
        Layer("conv_pre 192->512 k7", 192, 512, 7, frames),
        Layer("up0 512->256 k16 s10", 512, 256, 16, frames, stride=10, transpose=True),
        Layer("res 256 k3 d1", 256, 256, 3, t0),
        Layer("res 256 k11 d5", 256, 256, 11, t0, dilation=5),
        Layer("up1 256->128 k16 s8", 256, 128, 16, t0, stride=8, transpose=True),
        Layer("res 128 k7 d3", 128, 128, 7, t1, dilation=3),
        Layer("res 128 k11 d5", 128, 128, 11, t1, dilation=5),
        Layer("up2 128->64 k8 s2", 128, 64, 8, t1, stride=2, transpose=True),
        Layer("res 64 k7 d3", 64, 64, 7, t2, dilation=3),
        Layer("up3 64->32 k2 s2", 64, 32, 2, t2, stride=2, transpose=True),
        Layer("res 32 k7 d1", 32, 32, 7, t3),
        Layer("res 32 k11 d5", 32, 32, 11, t3, dilation=5),
        Layer("up4 32->16 k2 s2", 32, 16, 2, t3, stride=2, transpose=True),
        Layer("res 16 k11 d5", 16, 16, 11, t4, dilation=5),
        Layer("conv_post 16->1 k7", 16, 1, 7, t4),
    ]


def best_of(fn, repeat: int, budget_s: float = 3.0) -> float:
    """Min seconds of ``fn`` over ``repeat`` runs after one warm-up; fewer runs when one is slow."""
    t = time.perf_counter()
    fn()
    first = time.perf_counter() - t
    if first > budget_s:
        return first
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


# ---------------------------------------------------------------------------------------------------
# candidates: each returns a zero-argument callable running the layer, or raises ImportError


def cand_mlx(layer: Layer, x_ncl, w_onnx, gemm: bool):
    import mlx.core as mx

    from ..models.sovits import conv

    x = mx.array(x_ncl.transpose(0, 2, 1))
    if layer.transpose:
        w = mx.array(w_onnx.transpose(1, 2, 0))  # ONNX (Ci, Co, K) -> MLX (Co, K, Ci)
        b = mx.zeros((layer.c_out,))
        if gemm:
            gw = conv.transpose_gemm_weight(w, layer.stride)
            mx.eval(gw)
            return lambda: mx.eval(conv.conv_transpose1d_gemm(x, gw, b, layer.kernel, layer.stride, layer.padding))
        return lambda: mx.eval(conv.conv_transpose1d_native(x, w, b, layer.stride, layer.padding))
    w = mx.array(w_onnx.transpose(0, 2, 1))  # (Co, Ci, K) -> (Co, K, Ci)
    b = mx.zeros((layer.c_out,))
    fn = conv.conv1d_gemm if gemm else conv.conv1d_native
    mx.eval(x, w, b)
    return lambda: mx.eval(fn(x, w, b, padding=layer.padding, dilation=layer.dilation))


def onnx_layer_model(layer: Layer, w_onnx, conv2d: bool = False):
    """A one-node graph; ``conv2d``: the same conv over (B, C, 1, T) with a (1, K) kernel (NCHWc path)."""
    from onnx import TensorProto, helper, numpy_helper

    pads = [0, layer.padding, 0, layer.padding] if conv2d else [layer.padding, layer.padding]
    attrs = {"kernel_shape": [1, layer.kernel] if conv2d else [layer.kernel], "pads": pads}
    if layer.transpose:
        attrs["strides"] = [1, layer.stride] if conv2d else [layer.stride]
        op = "ConvTranspose"
    else:
        attrs["dilations"] = [1, layer.dilation] if conv2d else [layer.dilation]
        op = "Conv"
    node = helper.make_node(op, ["x", "w"], ["y"], **attrs)
    shape = [1, layer.c_in, 1, layer.length] if conv2d else [1, layer.c_in, layer.length]
    graph = helper.make_graph(
        [node],
        "layer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w_onnx[:, :, None, :] if conv2d else w_onnx, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def cand_onnxruntime(layer: Layer, x_ncl, w_onnx, threads: int, conv2d: bool = False):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(
        onnx_layer_model(layer, w_onnx, conv2d).SerializeToString(), opts, providers=["CPUExecutionProvider"]
    )
    x = x_ncl[:, :, None, :] if conv2d else x_ncl
    return lambda: sess.run(None, {"x": x})


def cand_openvino(layer: Layer, x_ncl, w_onnx, threads: int):
    import openvino as ov

    core = ov.Core()
    model = core.read_model(onnx_layer_model(layer, w_onnx).SerializeToString(), b"")
    config = {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"}
    compiled = core.compile_model(model, "CPU", config)
    request = compiled.create_infer_request()
    return lambda: request.infer({0: x_ncl})


def cand_numpy_gemm(layer: Layer):
    import numpy as np

    m, k, n = layer.gemm_shape()
    rng = np.random.default_rng(1)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    return lambda: a @ b


CANDIDATES = ("mlx-native", "mlx-gemm", "onnxruntime", "onnxruntime-2d", "openvino", "numpy-gemm")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("``", ""),
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads of every candidate")
    p.add_argument("--frames", type=int, default=200, help="latent frames (200 = 4 s of audio)")
    p.add_argument("--repeat", type=int, default=5, help="timed runs per layer and candidate")
    p.add_argument("--only", default=",".join(CANDIDATES), help="comma list of candidates")
    p.add_argument("--skip-slow-native", action="store_true", help="skip mlx-native dilated/transposed layers")
    args = p.parse_args(argv)
    import numpy as np

    from .. import _blas

    _blas.preload()  # the fast BLAS before mlx loads
    _blas.configure_threads(args.threads)

    wanted = [c.strip() for c in args.only.split(",") if c.strip()]
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2048, 2048), dtype=np.float32)
    peak = 2 * 2048**3 / best_of(lambda: a @ a, 3) / 1e9
    print(f"bench_conv: {args.frames} frames, threads {args.threads}, loadavg {os.getloadavg()[0]:.2f}, "
          f"numpy sgemm 2048^3 peak {peak:.1f} GFLOP/s")
    header = f"{'layer':<24}{'GFLOP':>7}  " + "".join(f"{c:>20}" for c in wanted)
    print(header)
    print(" " * 33 + "".join(f"{'ms (GFLOP/s)':>20}" for _ in wanted))
    totals = {c: 0.0 for c in wanted}
    for layer in generator_layers(args.frames):
        x = rng.standard_normal((1, layer.c_in, layer.length), dtype=np.float32)
        wshape = (layer.c_in, layer.c_out, layer.kernel) if layer.transpose else (layer.c_out, layer.c_in, layer.kernel)
        w = (rng.standard_normal(wshape, dtype=np.float32) * 0.05).astype(np.float32)
        cells = []
        for cand in wanted:
            try:
                if cand == "mlx-native":
                    if args.skip_slow_native and (layer.transpose or layer.dilation > 1):
                        raise ImportError("skipped")
                    fn = cand_mlx(layer, x, w, gemm=False)
                elif cand == "mlx-gemm":
                    fn = cand_mlx(layer, x, w, gemm=True)
                elif cand == "onnxruntime":
                    fn = cand_onnxruntime(layer, x, w, args.threads)
                elif cand == "onnxruntime-2d":
                    fn = cand_onnxruntime(layer, x, w, args.threads, conv2d=True)
                elif cand == "openvino":
                    fn = cand_openvino(layer, x, w, args.threads)
                elif cand == "numpy-gemm":
                    fn = cand_numpy_gemm(layer)
                else:
                    raise ValueError(f"unknown candidate {cand}")
                s = best_of(fn, args.repeat)
                totals[cand] += s
                cells.append(f"{s * 1e3:9.2f} ({layer.flops / s / 1e9:6.1f})")
            except ImportError as exc:
                cells.append(f"{'n/a: ' + str(exc)[:14]:>20}")
        print(f"{layer.name:<24}{layer.flops / 1e9:7.2f}  " + "".join(f"{c:>20}" for c in cells))
        sys.stdout.flush()
    print(f"{'sum of these layers':<33}" + "".join(f"{totals[c] * 1e3:>11.1f} ms       " for c in wanted))
    return 0


if __name__ == "__main__":
    sys.exit(main())
