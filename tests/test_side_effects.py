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
