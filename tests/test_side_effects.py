"""Importing the package has no side effects, and every environment variable it reads is declared in settings."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dora_primespeech_mlx"


def _modules() -> list[str]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts[-1] == "__main__":
            continue
        out.append(".".join(parts))
    return out


def _is_mlx_layer(name: str) -> bool:
    """The models and the engine are MLX: importing them sets up the BLAS and loads MLX (nothing else does)."""
    return any(name.startswith(f"dora_primespeech_mlx.{p}") for p in ("models", "engine", "bench"))


_PROBE = r"""
import importlib, json, os, sys
names = json.loads(sys.argv[1])
before = dict(os.environ)
from dora_primespeech_mlx import _blas
for name in names:
    importlib.import_module(name)
print(json.dumps({"env_changed": sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k)),
                  "mlx": "mlx.core" in sys.modules, "blas": _blas.info(), "threads": _blas.thread_settings()}))
"""


def _probe(names: list[str]) -> dict:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(names)], capture_output=True, text=True,
                         timeout=300, env=env, cwd=PACKAGE.parent)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_non_mlx_modules_loads_nothing_and_changes_nothing():
    names = [m for m in _modules() if not _is_mlx_layer(m)]
    assert "dora_primespeech_mlx.node" in names and "dora_primespeech_mlx.dataflow.messages" in names
    result = _probe(names)
    assert result["env_changed"] == []
    assert result["mlx"] is False, "a module outside models/engine imported mlx"
    assert result["blas"] == {"name": None, "path": None, "error": None}, "the BLAS was set up at import"
    assert result["threads"] == {}


def test_importing_everything_never_changes_the_environment():
    result = _probe(_modules())
    assert result["env_changed"] == [], "an import wrote environment variables"
    assert result["mlx"] is True and result["threads"], "the engine sets the BLAS up before MLX loads"


def test_environment_is_read_only_in_settings():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "settings.py" and path.parent == PACKAGE:
            continue
        if path.parent == PACKAGE / "demo":  # the demo nodes' own variables (SCRIPT_FILE, OUTPUT_DIR: their docstrings)
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv", "unsetenv"):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert offenders == [], f"environment access outside settings.py: {offenders}"


# Modules that read settings from the environment: the entry points, which pass the values down as arguments
# (the text front end's folders too: text/options.py's TextData, built from the caller's Settings).
READS_SETTINGS = {"settings.py", "cli.py", "node.py"}
# Settings.from_env(): the entry points, the engine when made without settings (GPTSoVITSEngine(), the documented
# Python API of docs/python-api.md) and the benchmark's entry.
# bench/conversation.py: its side processes are entry points that run the node's handler as node.py does.
BUILDS_SETTINGS = {"settings.py", "cli.py", "node.py", "engine/core.py", "bench/measure.py", "bench/conversation.py"}


def _settings_calls(tree: ast.AST) -> tuple[list[int], list[int]]:
    """Lines calling settings.read (also imported as another name) and Settings.from_env in one module."""
    read_names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("settings"):
            read_names |= {a.asname or a.name for a in node.names if a.name == "read"}
    reads, builds = [], []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id in read_names:
            reads.append(node.lineno)
        elif isinstance(f, ast.Attribute) and f.attr == "read" and isinstance(f.value, ast.Name) \
                and f.value.id == "settings":
            reads.append(node.lineno)
        elif isinstance(f, ast.Attribute) and f.attr == "from_env":
            builds.append(node.lineno)
    return reads, builds


def test_settings_are_read_only_at_the_entry_points():
    """``settings.read`` and ``Settings.from_env`` only where the issue allows them; everything below takes the
    model directory and the settings' values as arguments."""
    reads, builds = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        r, b = _settings_calls(ast.parse(path.read_text(encoding="utf-8")))
        reads += [f"{rel}:{n}" for n in r if rel not in READS_SETTINGS]
        builds += [f"{rel}:{n}" for n in b if rel not in BUILDS_SETTINGS]
    assert reads == [], f"settings.read outside the entry points: {reads}"
    assert builds == [], f"Settings.from_env outside the entry points: {builds}"


def test_the_check_sees_a_settings_read():
    """The scan above finds the forms a read takes (so an empty result means none)."""
    code = "from ..settings import read as r\nfrom . import settings\nr('x')\nsettings.read('y')\nSettings.from_env()\n"
    assert _settings_calls(ast.parse(code)) == ([3, 4], [5])


def test_no_model_directory_falls_back_to_the_environment():
    """The voice catalog and downloads take the model directory (``root``) as a required argument."""
    defaulted = []
    for path in sorted((PACKAGE / "assets").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                positional = a.posonlyargs + a.args
                with_default = positional[len(positional) - len(a.defaults):] if a.defaults else []
                with_default += [k for k, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
                defaulted += [f"{path.name}:{node.name}" for arg in with_default if arg.arg in ("root", "model_dir")]
    assert defaulted == [], f"model directory with a default: {defaulted}"
