"""Regenerate ``dora_primespeech_mlx.models.sv.fbank.MKL_LN_ULP_OFFSETS``.

The original's Kaldi fbank (``eres2net/kaldi.py``, float32 tensors on CPU) computes the mel value of every
FFT bin with torch's float32 ``log``, which on x86 CPUs is Intel MKL's ``vsLn`` in high-accuracy mode
(``aten/src/ATen/cpu/vml.h``: ``VML_HA | VML_FTZDAZ_OFF | VML_ERRMODE_IGNORE``). It is not correctly rounded;
this script prints, per (padded window, sample rate), the bins where it differs from the correctly rounded
logarithm and by how many ulps. Development tool only: MKL is not a dependency of the package.

    pip download --no-deps mkl -d /tmp/mkl && unzip -q /tmp/mkl/mkl-*.whl -d /tmp/mkl
    MKL_THREADING_LAYER=SEQUENTIAL python tests/tools/mkl_mel_log_offsets.py /tmp/mkl/mkl-*.data/data/lib
"""

from __future__ import annotations

import argparse
import ctypes
from decimal import Decimal, getcontext
from pathlib import Path

import numpy as np

VML_HA, VML_FTZDAZ_OFF, VML_ERRMODE_IGNORE = 0x2, 0x140000, 0x100


def mkl_ln(lib: ctypes.CDLL, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.empty_like(x)
    mode = ctypes.c_longlong(VML_HA | VML_FTZDAZ_OFF | VML_ERRMODE_IGNORE)
    lib.vmsLn(ctypes.c_longlong(x.size), x.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p), mode)
    return y


def offsets(lib: ctypes.CDLL, padded_window: int, sample_rate: float) -> dict[int, int]:
    f32 = np.float32
    freq = f32(sample_rate / padded_window) * np.arange(padded_window // 2, dtype=f32)
    arg = f32(1.0) + freq / f32(700.0)  # kaldi.py mel_scale, float32
    mkl = mkl_ln(lib, arg)
    getcontext().prec = 60
    exact = np.array([f32(float(Decimal(float(a)).ln())) for a in arg], dtype=f32)  # correctly rounded
    out = {}
    for k in np.flatnonzero(mkl != exact):
        out[int(k)] = int(round((float(mkl[k]) - float(exact[k])) / float(np.spacing(exact[k]))))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mkl_lib_dir", type=Path, help="folder holding libmkl_rt.so.*")
    p.add_argument("--padded-window", type=int, default=512)
    p.add_argument("--sample-rate", type=float, default=16000.0)
    a = p.parse_args()
    rt = sorted(a.mkl_lib_dir.glob("libmkl_rt.so*"))
    if not rt:
        raise SystemExit(f"no libmkl_rt.so* in {a.mkl_lib_dir}")
    lib = ctypes.CDLL(str(rt[0]), mode=ctypes.RTLD_GLOBAL)
    print(f"({a.padded_window}, {a.sample_rate}): {offsets(lib, a.padded_window, a.sample_rate)}")


if __name__ == "__main__":
    main()
