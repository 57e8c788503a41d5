"""Every dataflow a user is shown (dataflow.yaml, examples/**) passes `dora validate` of the installed dora CLI,
and the distributed examples place their nodes on machines/labels that examples/distributed/cluster.yml defines."""

from __future__ import annotations

import os
import shutil
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
    result = subprocess.run([_dora(), "validate", str(flow)], cwd=tmp_path, capture_output=True, text=True,
                            timeout=60, env={**os.environ, "RUST_BACKTRACE": "0"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Descriptor config OK" in result.stdout


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
