"""Every dataflow a user is shown (dataflow.yaml, examples/**) passes `dora validate` of the installed dora CLI,
the distributed examples place their nodes on machines/labels that examples/distributed/cluster.yml defines, the
shipped dataflow.yaml names only the package's console scripts, and offline it says once why it cannot speak."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def shown_files() -> list[Path]:
    files = [REPO / "dataflow.yaml"]
    files += sorted(p for ext in ("yaml", "yml") for p in (REPO / "examples").rglob(f"*.{ext}"))
    return files


def dataflows() -> list[Path]:
    return [p for p in shown_files() if "nodes" in (yaml.safe_load(p.read_text(encoding="utf-8")) or {})]


def _dora() -> str:
    exe = Path(sys.executable).parent / "dora"
    found = str(exe) if exe.exists() else shutil.which("dora")
    if not found:
        pytest.skip("dora CLI (dora-rs-cli) not installed")
    return found


def test_every_shown_yaml_is_a_dataflow_or_the_cluster_file():
    files = shown_files()
    others = [p for p in files if p not in dataflows()]
    assert [p.name for p in others] == ["cluster.yml"], others
    assert len(dataflows()) >= 5  # dataflow.yaml, operator, orchestrator, distributed by machine and by label


@pytest.mark.parametrize("flow", dataflows(), ids=lambda p: str(p.relative_to(REPO)))
def test_dora_validate(flow, tmp_path):
    assert "${" not in flow.read_text(encoding="utf-8"), "templates belong beside the tests that render them"
    # --strict-types: a type warning fails (dataflow.yaml: checked against the node manifest beside it, dora-node.yml)
    result = subprocess.run([_dora(), "validate", "--strict-types", str(flow)], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60, env={**os.environ, "RUST_BACKTRACE": "0"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Descriptor config OK" in result.stdout and "All type annotations OK" in result.stdout


def test_distributed_placement_matches_cluster_file():
    folder = REPO / "examples" / "distributed"
    cluster = yaml.safe_load((folder / "cluster.yml").read_text(encoding="utf-8"))
    machines = {m["id"]: {str(k): str(v) for k, v in (m.get("labels") or {}).items()} for m in cluster["machines"]}
    placed = {}
    for flow in sorted(folder.glob("*.yaml")):
        for node in yaml.safe_load(flow.read_text(encoding="utf-8"))["nodes"]:
            deploy = node.get("deploy")
            assert deploy, f"{flow.name}: {node['id']} has no deploy section"
            if "machine" in deploy:
                machine = deploy["machine"]
                assert machine in machines, (flow.name, node["id"], machine)
            else:
                wanted = deploy["labels"]
                assert all(isinstance(v, str) for v in wanted.values()), "label values are strings"
                matching = [m for m, labels in machines.items() if wanted.items() <= labels.items()]
                assert len(matching) == 1, (flow.name, node["id"], wanted, matching)
                machine = matching[0]
            placed.setdefault(flow.name, {})[node["id"]] = machine
    expected = {"text_source": "edge", "wav_sink": "edge", "primespeech": "tts"}
    assert placed == {"dataflow.yaml": expected, "dataflow-labels.yaml": expected}


def _console_scripts() -> dict[str, str]:
    """pyproject.toml's [project.scripts] (read with a pattern: tomllib needs Python 3.11)."""
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    section = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r'^([\w.-]+) = "([^"]+)"', section, re.MULTILINE))


def test_shipped_dataflow_names_the_package_console_scripts():
    """dataflow.yaml runs from any folder: every node is a console script of this package (no file paths), each
    demo node's script points at the module that nodes/<name>.py runs, and the voice is left to the shell."""
    scripts = _console_scripts()
    flow = yaml.safe_load((REPO / "dataflow.yaml").read_text(encoding="utf-8"))
    for node in flow["nodes"]:
        assert node["path"] in scripts, (node["id"], node["path"])
    for target in scripts.values():
        module, _, func = target.partition(":")
        if module.startswith("dora_primespeech_mlx.demo."):
            launcher = REPO / "nodes" / f"{module.rsplit('.', 1)[1]}.py"
            assert launcher.is_file() and f"from {module} import {func}" in launcher.read_text(encoding="utf-8")
    tts = next(n for n in flow["nodes"] if n["path"] == "dora-primespeech-mlx")
    assert "VOICE_NAME" not in (tts.get("env") or {}), "a VOICE_NAME under env: would win over the shell's"


def test_the_package_holds_the_shipped_dataflow(tmp_path, capsys):
    """`primespeech-mlx dataflow` writes the packaged copy: the same bytes as the checkout's dataflow.yaml."""
    from dora_primespeech_mlx.cli import main

    assert main(["dataflow", str(tmp_path)]) == 0
    assert (tmp_path / "dataflow.yaml").read_bytes() == (REPO / "dataflow.yaml").read_bytes(), \
        "copy dataflow.yaml to dora_primespeech_mlx/demo/dataflow.yaml"
    assert "dora run dataflow.yaml" in capsys.readouterr().out
    assert main(["dataflow", str(tmp_path)]) == 2  # never overwritten without --force
    assert "--force" in capsys.readouterr().err


def _runnable_here(flow: dict) -> dict:
    """The shipped flow with each demo node run from this checkout's nodes/ launcher (the same code as its
    console script, which a development venv may not have installed yet)."""
    scripts = _console_scripts()
    for node in flow["nodes"]:
        module = scripts[node["path"]].partition(":")[0]
        if module.startswith("dora_primespeech_mlx.demo."):
            node["path"] = str(REPO / "nodes" / f"{module.rsplit('.', 1)[1]}.py")
    return flow


@pytest.mark.dora
def test_shipped_dataflow_offline_says_it_once(tmp_path):
    """The shipped dataflow.yaml with no voice files and downloads off (both from the shell, with the shell's
    VOICE_NAME): the TTS node's whole message is its last lines, and dora's output ends with it (the headline, the
    missing files, the command that fixes it); the demo nodes end with one line each that points at it without
    repeating it (exit 0: no second failure), and only the TTS node fails."""
    flow = _runnable_here(yaml.safe_load((REPO / "dataflow.yaml").read_text(encoding="utf-8")))
    path = tmp_path / "dataflow.yaml"
    path.write_text(yaml.safe_dump(flow, allow_unicode=True), encoding="utf-8")
    empty = tmp_path / "empty-models"
    empty.mkdir()
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "RUST_BACKTRACE": "0",
           "VOICE_NAME": "Maple", "PRIMESPEECH_MODEL_DIR": str(empty), "PRIMESPEECH_AUTO_DOWNLOAD": "false"}
    proc = subprocess.Popen([_dora(), "run", str(path)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode != 0, out
    command = f"primespeech-mlx download 'Maple' --model-dir {empty}"
    headline = "voice 'Maple' is not installed"
    # the node writes it once, on stderr; dora 1.1 shows stderr as it comes and repeats a failed node's stderr in its
    # exit report and the summary: every copy is the whole message (no headline without its files and fix)
    assert out.count(command) == out.count(headline) >= 1, out
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    end = max(i for i, ln in enumerate(lines) if ln == command)
    summary = max(i for i, ln in enumerate(lines) if headline in ln)
    files = lines[summary + 1:end]
    assert lines[summary].startswith("[primespeech] ERROR cannot start: voice 'Maple' is not installed; missing:")
    assert any(str(empty) in ln and "moyoyo" in ln for ln in files), out  # the files, then the fix
    assert all(ln.startswith(("-----", "Location:", "binaries/")) for ln in lines[end + 1:]), out  # then the end
    for node in ("text_source", "wav_sink"):
        said = [ln for ln in lines if f"{node}: " in ln and "could not start" in ln]
        assert len(said) == 1 and headline not in said[0] and "at the end" in said[0], out
        assert f"Node `{node}` failed" not in out, out
    assert "closed while waiting" not in out and "Traceback" not in out, out
    assert "Node `primespeech` failed" in out
