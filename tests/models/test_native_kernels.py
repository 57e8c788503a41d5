"""The native build (native.py, csrc/) and the per-ISA choice (models/kernels/half_gemv.py and cpu_paths.py).

- every build of csrc/half_gemv.c (avx512, avx2, generic) and the BLAS shim compile with -Wall -Wextra and no
  warning (avx512 only compiled where the CPU lacks it);
- the C self-test (kernel output against a scalar double reference) passes natively for each build this CPU runs;
- PRIMESPEECH_ISA: a forced build is used, refused where the CPU lacks it, ``none`` gives no kernels; bad values
  are refused; the stage paths (PRIMESPEECH_GPT_PREFILL, PRIMESPEECH_BERT_GEMM) are reported with a reason;
- HalfMatrix's float32 path is the float32 product of the upcast weight, bit for bit, and close to the float16
  path; hostile arguments raise;
- aarch64 (slow): cross-compiled with gcc-aarch64-linux-gnu, the self-test passes under qemu-aarch64; the
  sources build for aarch64-macos with zig cc (each skipped with its reason when the tool is absent).
"""

from __future__ import annotations  # noqa: I001  (the package must load before mlx)

import importlib.util
import platform
import shutil
import subprocess
import sys

import dora_primespeech_mlx  # noqa: F401  (preloads a fast BLAS)
import numpy as np
import pytest

from dora_primespeech_mlx import native
from dora_primespeech_mlx.errors import ConfigError
from dora_primespeech_mlx.models.kernels import cpu_paths
from dora_primespeech_mlx.models.kernels import half_gemv
from dora_primespeech_mlx.models.kernels.half_matrix import HalfMatrix
from dora_primespeech_mlx.runtime import Runtime
from dora_primespeech_mlx.settings import Settings

CC = native.c_compiler()
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler")
X86 = platform.machine().lower() in ("x86_64", "amd64")


def _flags() -> list[str]:
    flags = half_gemv.cpu_flags()
    return [] if isinstance(flags, str) else flags


def _runs_here(isa: str) -> bool:
    return isa == "generic" or (X86 and all(f in _flags() for f in half_gemv.NEEDS[isa]))


@needs_cc
@pytest.mark.parametrize("isa", half_gemv.ISAS)
def test_every_build_compiles_without_warnings(tmp_path, isa):
    if isa != "generic" and not X86:
        pytest.skip(f"{isa} is an x86-64 build")
    cmd = [CC, "-shared", "-fPIC", *native.WARNINGS, "-Werror", *half_gemv.FLAGS[isa], f"-I{native.CSRC}",
           str(native.source("half_gemv")), "-o", str(tmp_path / "k.so")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


@needs_cc
def test_blas_shim_compiles_without_warnings(tmp_path):
    cmd = [CC, "-c", "-fPIC", *native.WARNINGS, "-Werror", str(native.source("blas_shim")), "-o", str(tmp_path / "s.o")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


@needs_cc
@pytest.mark.parametrize("isa", half_gemv.ISAS)
def test_c_self_test_passes_for_each_build_this_cpu_runs(tmp_path, isa):
    if not _runs_here(isa):
        pytest.skip(f"this CPU cannot run the {isa} build")
    exe = tmp_path / "selftest"
    cmd = [CC, *native.WARNINGS, "-Werror", *half_gemv.FLAGS[isa], f"-I{native.CSRC}",
           str(native.CSRC / "half_gemv_selftest.c"), "-o", str(exe), "-lm"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "all checks passed" in run.stdout, run.stdout
    assert f"variant: {isa}" in run.stdout


def test_missing_source_and_compiler_are_clear_errors(monkeypatch):
    for bad in ("../../etc/passwd", "half_gemv.c", "", "a b"):
        with pytest.raises(native.BuildError, match="bad C source name"):
            native.source(bad)
    with pytest.raises(native.BuildError, match="no C source"):
        native.source("no_such_kernel")
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with pytest.raises(native.BuildError, match="cannot run"):
        native.compile_shared("half_gemv", ["-DPRIMESPEECH_TEST_NO_CC"])


@needs_cc
def test_compiler_errors_are_reported(monkeypatch):
    with pytest.raises(native.BuildError, match="failed to build half_gemv"):
        native.compile_shared("half_gemv", ["-DPRIMESPEECH_TEST_BAD", "-include", "/nonexistent/header.h"])


def test_isa_setting_is_validated():
    assert Settings.from_env({"PRIMESPEECH_ISA": "AVX2"}).isa == "avx2"
    for bad in ("sse", "avx2;rm", "1"):
        with pytest.raises(ConfigError, match="PRIMESPEECH_ISA"):
            Settings.from_env({"PRIMESPEECH_ISA": bad})
    with pytest.raises(ConfigError, match="PRIMESPEECH_GPT_PREFILL"):
        Settings.from_env({"PRIMESPEECH_GPT_PREFILL": "float8"})
    with pytest.raises(ValueError, match="expected one of"):
        half_gemv.library("neon")
    with pytest.raises(ConfigError, match="isa='neon'"):
        Runtime(isa="neon")


@needs_cc
def test_forced_builds_none_and_refusals():
    assert half_gemv.library("none") is None and half_gemv.isa("none") == "none"
    assert cpu_paths.chosen(Runtime(isa="none"))["gpt_decode"][0] == "float32"
    lib = half_gemv.library("generic")
    assert lib is not None and lib.isa == "generic" and half_gemv.isa("generic") == "generic"
    for isa in ("avx512", "avx2"):
        if _runs_here(isa):
            assert half_gemv.isa(isa) == isa
        else:
            assert half_gemv.library(isa) is None
            assert f"PRIMESPEECH_ISA={isa}" in half_gemv.library_status(isa)["why_not"]


@needs_cc
def test_builds_side_by_side_in_one_process():
    """Two runtimes asking for different builds each get theirs (a cache per build, no process-wide choice)."""
    generic, default = half_gemv.library("generic"), half_gemv.library("auto")
    assert generic is not None and generic.isa == "generic"
    assert half_gemv.library("none") is None
    assert half_gemv.library("generic") is generic and half_gemv.library("auto") is default
    assert half_gemv.kernel("generic", "0") is None and half_gemv.kernel("generic", "auto") is generic


@needs_cc
@pytest.mark.parametrize("isa", half_gemv.ISAS)
def test_each_build_matches_float64(isa):
    if not _runs_here(isa):
        pytest.skip(f"this CPU cannot run the {isa} build")
    lib = half_gemv.library(isa)
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((101, 77)) * 0.05).astype(np.float16)
    x = rng.standard_normal((13, 77)).astype(np.float32)
    b = rng.standard_normal(101).astype(np.float32)
    m = HalfMatrix(w, lib)
    want = x.astype(np.float64) @ w.astype(np.float64).T + b
    np.testing.assert_allclose(m.matmul_t(x, b), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(m.matvec(x[0], b), want[0], rtol=1e-5, atol=1e-5)


def test_stage_paths_default_forced_and_reported():
    chosen = cpu_paths.chosen()
    assert set(chosen) == {"gpt_decode", "gpt_prefill", "bert"}
    assert all(isinstance(p, str) and why for p, why in chosen.values())
    if half_gemv.library() is not None:
        isa = half_gemv.isa()
        key = (isa, "gpt_prefill", cpu_paths.several_blas_threads())
        assert cpu_paths.path("gpt_prefill") == cpu_paths.DEFAULTS[key]
        forced = Runtime.from_settings(Settings.from_env({"PRIMESPEECH_GPT_PREFILL": "float16"}))
        assert cpu_paths.path("gpt_prefill", forced) == ("float16", "PRIMESPEECH_GPT_PREFILL=float16")
        assert cpu_paths.path("gpt_prefill", Runtime(gpt_prefill="float32"))[0] == "float32"
        assert cpu_paths.path("bert", Runtime(bert_gemm="float32"))[0] == "float32"
    with pytest.raises(ValueError):
        cpu_paths.path("gpt_decode")
    for field, path in (("bert_gemm", "float64"), ("gpt_prefill", "fast")):
        with pytest.raises(ConfigError):
            Runtime(**{field: path})


@pytest.fixture(scope="module")
def lib():
    k = half_gemv.library()
    if k is None:
        pytest.skip(f"float16 kernels unavailable here: {half_gemv.library_status()['why_not']}")
    return k


@pytest.mark.parametrize("act", [None, "relu", "gelu"])
def test_float32_path_is_the_float32_product(lib, act):
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((96, 200)) * 0.05).astype(np.float16)
    x = rng.standard_normal((37, 200)).astype(np.float32)
    b = rng.standard_normal(96).astype(np.float32)
    m = HalfMatrix(w, lib)
    got = m.matmul_t(x, b, act, path="float32")
    if act is None:
        np.testing.assert_array_equal(got, x @ w.astype(np.float32).T + b)  # the float32 model's product, exactly
    np.testing.assert_allclose(got, m.matmul_t(x, b, act, path="float16"), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(m.matmul_t(x[None], b, act, path="float32")[0], got)  # leading dims


def test_matmul_t_refuses_hostile_arguments(lib):
    m = HalfMatrix(np.zeros((4, 8), np.float16), lib)
    x = np.zeros((2, 8), np.float32)
    with pytest.raises(ValueError, match="path"):
        m.matmul_t(x, path="float64")
    with pytest.raises(ValueError, match="act"):
        m.matmul_t(x, act="tanh")
    with pytest.raises(ValueError, match="bias"):
        m.matmul_t(x, np.zeros(5, np.float32), path="float32")
    with pytest.raises(ValueError, match="expected"):
        m.matmul_t(np.zeros((2, 7), np.float32), path="float32")
    with pytest.raises(ValueError, match="out must be"):
        m.float32(np.zeros((8, 4), np.float32))
    with pytest.raises(ValueError, match="2-D float16"):
        HalfMatrix(np.zeros((4, 8), np.float32), lib)


# ---- aarch64 (Linux under qemu, macOS with zig cc) -----------------------------------------------------------

AARCH64_GCC = shutil.which("aarch64-linux-gnu-gcc")
QEMU = shutil.which("qemu-aarch64")


@pytest.mark.slow
@pytest.mark.skipif(AARCH64_GCC is None or QEMU is None,
                    reason="needs gcc-aarch64-linux-gnu, libc6-dev-arm64-cross and qemu-user (apt)")
def test_aarch64_build_passes_its_self_test_under_qemu(tmp_path):
    exe = tmp_path / "selftest-aarch64"
    cmd = [AARCH64_GCC, "-static", *native.WARNINGS, "-Werror", *half_gemv.FLAGS["generic"], f"-I{native.CSRC}",
           str(native.CSRC / "half_gemv_selftest.c"), "-o", str(exe), "-lm"]
    cmd = [c for c in cmd if c != "-Wno-psabi"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
    run = subprocess.run([QEMU, str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "all checks passed" in run.stdout, run.stdout + run.stderr
    assert "variant: generic" in run.stdout


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("ziglang") is None, reason="needs the ziglang package (pip)")
def test_sources_build_for_macos_arm64_with_zig(tmp_path):
    for name in ("half_gemv", "blas_shim"):
        cmd = [sys.executable, "-m", "ziglang", "cc", "-target", "aarch64-macos", "-O2", *native.WARNINGS, "-Werror",
               "-pthread", f"-I{native.CSRC}", "-c", str(native.source(name)), "-o", str(tmp_path / f"{name}.o")]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
