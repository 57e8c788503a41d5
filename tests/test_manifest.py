"""The dora 1.x node manifest (dora-node.yml beside pyproject.toml, and its copy in the package): generated from the
settings table, typed ports, accepted by the installed dora CLI's `dora validate --node-manifest`."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml
from test_dataflows import _dora

from dora_primespeech_mlx import manifest, settings
from dora_primespeech_mlx.dataflow.params import PARAMETERS

REPO = Path(__file__).resolve().parents[1]
CHECKOUT = REPO / "dora-node.yml"
PACKAGED = REPO / "dora_primespeech_mlx" / "dora-node.yml"
PARSERS = {"bool": settings._bool, "int": settings._int, "float": settings._number}


def test_both_copies_are_the_generated_manifest():
    text = manifest.manifest_text()
    for path in (CHECKOUT, PACKAGED):
        assert path.is_file() and path.read_text(encoding="utf-8") == text, \
            f"{path.relative_to(REPO)}: run python -m dora_primespeech_mlx.manifest --write"


def test_every_contract_setting_with_its_type_and_default():
    env = yaml.safe_load(CHECKOUT.read_text(encoding="utf-8"))["env"]
    contract = [v for v in settings.VARS if v.audience == "contract"]
    assert list(env) == [v.name for v in contract]
    shown = {name: default for name, _aliases, default, _meaning in settings.describe("contract")}
    for var in contract:
        entry = env[var.name]
        assert entry["description"].startswith(var.meaning), var.name
        assert entry["type"] in ("string", "int", "float", "bool"), var.name
        default = shown[var.name]
        if default is None:
            assert "default" not in entry, var.name
            continue
        assert entry["default"] == (str(default) if isinstance(default, Path) else default), var.name
        if entry["type"] in PARSERS:  # the declared type reads the default back as the setting's own parser does
            parsed = PARSERS[entry["type"]](str(entry["default"]).lower() if entry["type"] == "bool"
                                            else str(entry["default"]))
            assert parsed == var.parse(str(entry["default"])) == default, var.name
        else:
            assert isinstance(entry["default"], str), var.name


def test_typed_ports_and_parameters():
    data = yaml.safe_load(CHECKOUT.read_text(encoding="utf-8"))
    assert set(data["inputs"]) == {"text", "control", "reset"} and data["inputs"]["text"]["required"] is True
    assert set(data["outputs"]) == {"audio", "segment_complete", "status", "log"}
    for name in ("text", "control"):
        assert data["inputs"][name]["type"] == "std/core/v1/String"
    for name in ("segment_complete", "status", "log"):
        assert data["outputs"][name]["type"] == "std/core/v1/String"
    audio = data["outputs"]["audio"]["type"]
    assert audio.startswith(f"{data['namespace']}/") and audio in data["types"]  # shipped under its namespace
    assert data["entrypoint"] == "dora-primespeech-mlx" and "path: dora-primespeech-mlx" in data["example"]
    text = CHECKOUT.read_text(encoding="utf-8")
    assert all(key in text.split("apiVersion")[0] for key in PARAMETERS)  # the header names the parameters


def test_dora_validate_accepts_the_manifest_and_refuses_a_broken_one(tmp_path):
    dora = _dora()
    env = {**os.environ, "RUST_BACKTRACE": "0"}
    ok = subprocess.run([dora, "validate", "--node-manifest", str(CHECKOUT)], capture_output=True, text=True,
                        timeout=60, env=env)
    assert ok.returncode == 0 and "Node manifest OK" in ok.stdout, ok.stdout + ok.stderr
    broken = tmp_path / "dora-node.yml"
    broken.write_text(CHECKOUT.read_text(encoding="utf-8").replace("std/core/v1/String", "std/core/v1/Strin"),
                      encoding="utf-8")
    bad = subprocess.run([dora, "validate", "--node-manifest", str(broken)], capture_output=True, text=True,
                         timeout=60, env=env)
    assert bad.returncode != 0 and "std/core/v1/Strin" in bad.stdout + bad.stderr
