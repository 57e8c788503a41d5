"""The GPU check's parts that need no GPU, on the CPU (docs/gpu.md): its fixture loop over the case files, the
engine measurement, the summary and its failure accounting, and the pack's fat-binary pruning."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import fixtures_root, load_cases_json, require_fixture

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_check  # noqa: E402
import pack  # noqa: E402


def _run(args: list[str], timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(HERE / "gpu_check.py"), *args], capture_output=True, text=True,
                          timeout=timeout)


def _rows(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "check.jsonl").read_text(encoding="utf-8").splitlines()]


def test_fixture_loop_runs_every_encoder_case_on_the_cpu(tmp_path):
    """The check's fixture phase over the HuBERT and BERT golden tests (the quick tier's rows): every such case of
    cases.json comes back as a passed line, and the summary counts them."""
    require_fixture("models/cases.json")
    names = [c["name"] for c in load_cases_json()["cases"] if c["name"].startswith(("hubert", "bert"))]
    assert names
    proc = _run(["--device", "cpu", "--part", "core", "--fixtures", str(fixtures_root()), "--out", str(tmp_path),
                 "--quick", "--select", "hubert_matches_golden or bert_matches_golden"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    tests = [r for r in _rows(tmp_path) if r.get("phase") == "fixtures"]
    for name in names:
        mine = [r for r in tests if f"[{name}" in r["test"] or f"-{name}]" in r["test"]]
        assert mine and all(r["outcome"] == "passed" for r in mine), (name, mine)
    assert all(r["variant"] == "default" for r in tests)
    summary = (tmp_path / "summary.md").read_text(encoding="utf-8")
    assert f"| default | {len(tests)} | 0 | 0 |" in summary


def test_engine_measurement_with_the_tiny_voice(tmp_path):
    """One bigset configuration (the check runs it on the real-size set) with the tiny fixture voice."""
    require_fixture("models/cases.json")
    proc = _run(["engine", "--sentences", "2", "--repeat", "1", "--models", str(tmp_path),
                 "--tiny", str(fixtures_root())])
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("ENGINE "))[7:])
    assert res["sentences"] == 2 and res["tokens"] > 0 and res["audio_s"] > 0
    assert 0 < res["first_audio_s"] <= res["stream_total_s"]
    assert res["gpt_tokens_per_s"] > 0 and res["sovits_s_per_audio_s"] > 0
    assert "cpu" in res["device"]


@pytest.mark.slow
def test_whole_check_on_the_cpu(tmp_path):
    """Every part's fixture tests (--full) and every bigset configuration (tiny voice), as the device runs them."""
    require_fixture("models/cases.json")
    proc = _run(["--device", "cpu", "--part", "all", "--fixtures", str(fixtures_root()), "--out", str(tmp_path),
                 "--bigset", "--tiny", "--repeat", "1", "--models", str(tmp_path / "m"), "--budget-s", "3000"],
                timeout=3600)
    assert proc.returncode == 0, proc.stdout[-3000:]
    rows = _rows(tmp_path)
    assert sum(r.get("phase") == "bigset" and "e2e_s" in r for r in rows) == 5


def test_summary_counts_and_informational_failures():
    head = {"part": "core", "device_name": "Device(gpu, 0)", "mlx": "x", "python": "3.12", "seconds": 1.0}
    rows = [
        {"phase": "fixtures", "variant": "default", "test": "a[gpt_greedy]", "outcome": "passed", "errors": ["e 1"]},
        {"phase": "fixtures", "variant": "default", "test": "b[hubert]", "outcome": "skipped", "errors": []},
        {"phase": "fixtures", "variant": "bert-float16", "test": "c[bert_0]", "outcome": "failed", "errors":
            ["max_abs_err=3e-3 tol atol=1e-4"], "message": "AssertionError"},
        {"phase": "bigset", "config": "1 sentence(s), batch 1", "e2e_s": 1.0, "first_audio_s": 0.2,
         "stream_total_s": 1.1, "tokens": 100, "audio_s": 4.0, "gpt_tokens_per_s": 200.0,
         "sovits_s_per_audio_s": 0.01},
        {"phase": "bigset", "config": "8 sentence(s), batch 8", "outcome": "not run", "message": "time budget"},
        {"phase": "fixtures", "variant": "gemm-conv", "file": "engine/test_engine.py", "outcome": "not run",
         "message": "stopped at the time budget"},
    ]
    text = gpu_check.summary(rows, head)
    assert "| default | 1 | 0 | 1 |" in text
    assert "| bert-float16 (informational: float16 storage) | 0 | 1 | 0 |" in text
    assert "max_abs_err=3e-3" in text and "| 1 sentence(s), batch 1 | 1.000 | 0.200 |" in text
    assert "not run: 8 sentence(s), batch 8 (time budget)" in text
    assert "not run: gemm-conv engine/test_engine.py (stopped at the time budget)" in text
    assert not gpu_check.failed(rows)  # the float16 variant's failure is informational
    rows.append({"phase": "fixtures", "variant": "default", "test": "d", "outcome": "failed", "errors": []})
    assert gpu_check.failed(rows)
    broken = [{"phase": "environment", "smoke": {"matmul": {"error": "RuntimeError: no CUDA"}}}]
    assert gpu_check.failed(broken)
    assert "- matmul: RuntimeError: no CUDA" in gpu_check.summary(rows, dict(head, smoke=broken[0]["smoke"]))


def test_smoke_checks_each_operation_against_numpy():
    got = gpu_check.smoke()
    assert set(got) == {"matmul", "matmul_float16", "conv1d", "compile"}
    assert all("error" not in r for r in got.values()), got
    assert got["matmul"]["max_abs_err"] < 1e-4 and got["conv1d"]["max_abs_err"] < 1e-4
    assert got["compile"]["max_abs_err"] < 1e-5 and got["matmul_float16"]["max_abs_err"] < 0.1


def _elf_with_fatbin(entries: list[tuple[int, int, bytes]]) -> tuple[bytes, int]:
    """A minimal ELF64 file whose only named section is .nv_fatbin holding one fat binary of ``entries``
    (kind, arch, payload); also the payloads' offset in the file."""
    body = b""
    for kind, arch, payload in entries:
        header = struct.pack("<HHIQIIHHI", kind, 0x101, 64, len(payload), 0, 0, 0, 0, arch).ljust(64, b"\0")
        body += header + payload
    fat = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body
    names = b"\0.nv_fatbin\0.shstrtab\0"
    fat_at = 64
    names_at = fat_at + len(fat)
    shoff = (names_at + len(names) + 7) // 8 * 8
    sh = [struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
          struct.pack("<IIQQQQIIQQ", 1, 1, 2, 0, fat_at, len(fat), 0, 0, 8, 0),
          struct.pack("<IIQQQQIIQQ", 12, 3, 0, 0, names_at, len(names), 0, 0, 1, 0)]
    ehdr = bytearray(64)
    ehdr[:4] = b"\x7fELF"
    struct.pack_into("<Q", ehdr, 0x28, shoff)
    struct.pack_into("<HHH", ehdr, 0x3A, 64, len(sh), 2)
    data = bytes(ehdr) + fat + names
    return data.ljust(shoff, b"\0") + b"".join(sh), fat_at + 16


def test_prune_keeps_only_the_chosen_architecture(tmp_path):
    payloads = [(2, 80, b"\x11" * 48), (2, 90, b"\x22" * 40), (1, 90, b"\x33" * 24), (1, 120, b"\x44" * 32)]
    data, _ = _elf_with_fatbin(payloads)
    lib = tmp_path / "lib.so"
    lib.write_bytes(data)
    info = pack.prune_fatbins(lib, 90)
    after = lib.read_bytes()
    assert info == {"kept": 40 + 24, "zeroed": 48 + 32}
    assert b"\x22" * 40 in after and b"\x33" * 24 in after  # sm_90 cubin and compute_90 PTX kept
    assert b"\x11" not in after and b"\x44" not in after
    assert len(after) == len(data) and after[:64] == data[:64]  # headers and layout unchanged


def test_parts_name_real_fixture_files():
    """Every glob of every part matches a file of the fixture set, so no part silently carries less."""
    root = fixtures_root()
    if not (root / "models").is_dir():
        pytest.skip(f"no fixtures at {root}")
    files = [p.relative_to(root).as_posix() for p in pack.fixture_files(root)]
    for part, globs in pack.PARTS.items():
        for g in globs:
            assert any(pack.fnmatch.fnmatch(f, g) for f in files), (part, g)
    assert set(pack.PARTS) == set(gpu_check.PART_TESTS)
