"""Streaming behind one seam (engine/stream.py): a request's stream state is one object, made of one stage per module
(batching, pacing, streaming, overlap), given what it uses of the engine as one :class:`EnginePorts`; no module
reaches into another object's private (``_``-prefixed) members, and the engine has one public streaming entry,
``GPTSoVITSEngine.synthesize_stream``.

Read with ``ast`` (nothing is imported), like tests/test_architecture.py."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "dora_primespeech_mlx"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE
ENGINE = ROOT / "engine"
STAGES = ("stream", "batching", "pacing", "streaming", "overlap")

# Outside engine/, the private members read today: other libraries' (os._exit, pickle._Unpickler, a ctypes library's
# _name, coremltools' symbol values and model classes, llama-cpp's context) and a few of the package's own objects
# (the numpy decoder's layer states, the vocoder's module caches). None may be added.
KNOWN_OUTSIDE_ENGINE = {
    "os._exit", "pickle._Unpickler", "lib._name", "archive._patched", "load._model_classes", "var._sym_val",
    "var._sym_type", "llm._ctx", "s._input", "s._fused", "s._scratch", "states[0]._h", "module._cache",
}


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def private_accesses(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, expression) of each access ``x._name`` (``_name`` not a dunder) where ``x`` is not ``self`` or
    ``cls``: a module reaching into another object's private members."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        if node.attr.startswith("__") and node.attr.endswith("__"):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        found.append((node.lineno, ast.unparse(node)))
    return found


def test_private_access_finder_finds_them():
    tree = ast.parse("class A:\n    def f(self, engine):\n"
                     "        self._a, cls._b, self.engine._lock, engine._stats, x.__class__, self.ports.lock\n")
    assert sorted(e for _, e in private_accesses(tree)) == ["engine._stats", "self.engine._lock"]


def test_engine_modules_touch_no_other_objects_private_members():
    """No engine module reads or writes another object's ``_`` members (the stream reached into the engine's lock,
    counters, lane and queued-text preparation before it was handed :class:`EnginePorts`)."""
    offenders = [f"{path.relative_to(ROOT)}:{line}: {expr}" for path in sorted(ENGINE.rglob("*.py"))
                 for line, expr in private_accesses(_tree(path))]
    assert not offenders, "\n".join(offenders)


def test_no_new_private_access_outside_the_engine():
    """Elsewhere in the package only the known accesses remain (see :data:`KNOWN_OUTSIDE_ENGINE`), none new."""
    offenders = [f"{path.relative_to(ROOT)}:{line}: {expr}" for path in sorted(ROOT.rglob("*.py"))
                 if ENGINE not in path.parents
                 for line, expr in private_accesses(_tree(path)) if expr not in KNOWN_OUTSIDE_ENGINE]
    assert not offenders, "\n".join(offenders)


def _functions(tree: ast.Module):
    """(qualified name, node) of the module's functions and its classes' methods."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{item.name}", item


def _public(qualname: str) -> bool:
    return not any(part.startswith("_") for part in qualname.split("."))


def test_engine_has_one_public_streaming_entry():
    """Of engine/'s public functions and methods, one hands out streamed audio (returns an iterator of
    ``AudioChunk``): ``GPTSoVITSEngine.synthesize_stream``; and the engine's public methods name no other stream."""
    entries, stream_named = [], []
    for path in sorted(ENGINE.rglob("*.py")):
        for qualname, fn in _functions(_tree(path)):
            if not _public(qualname):
                continue
            returns = ast.unparse(fn.returns) if fn.returns is not None else ""
            if "AudioChunk" in returns and ("Iterator" in returns or "Generator" in returns):
                entries.append(f"{path.stem}.{qualname}")
            if path.stem == "core" and qualname.startswith("GPTSoVITSEngine.") and "stream" in qualname.lower():
                stream_named.append(qualname)
    assert entries == ["core.GPTSoVITSEngine.synthesize_stream"], entries
    assert stream_named == ["GPTSoVITSEngine.synthesize_stream"], stream_named


def _imported_names(tree: ast.Module, path: Path) -> list[tuple[str, str]]:
    """(engine module, name) each ``from ...engine.<module> import name`` / ``from ...engine import <module>``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            parts = ("." * node.level + (node.module or "")).split(".")
            if "engine" in parts:  # from ..engine.stream import X / from ..engine import stream
                tail = [p for p in parts[parts.index("engine") + 1:] if p]
                for alias in node.names:
                    out.append((tail[0], alias.name) if tail else (alias.name, "*"))
            elif path.parent == ENGINE and node.level == 1:  # inside engine/: from .stream import X
                for alias in node.names:
                    out.append((node.module, alias.name) if node.module else (alias.name, "*"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[:2] == [PACKAGE, "engine"] and len(parts) > 2:
                    out.append((parts[2], "*"))
    return out


def test_the_stream_is_made_by_the_engine_alone():
    """``Stream`` and ``EnginePorts`` are named only in engine/stream.py and engine/core.py (the entry); outside
    engine/ a module names none of the stages but the entry's argument types (``Upcoming``, ``Schedule``,
    ``Listener``, ``NO_SCHEDULE``)."""
    argument_types = {("batching", "Upcoming"), ("stream", "Schedule"), ("stream", "Listener"),
                      ("stream", "NO_SCHEDULE")}
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        tree = _tree(path)
        rel = str(path.relative_to(ROOT))
        if rel not in ("engine/stream.py", "engine/core.py"):
            for node in ast.walk(tree):
                name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
                if name in ("Stream", "EnginePorts"):
                    offenders.append(f"{rel}:{node.lineno}: {name}")
        if ENGINE in path.parents:
            continue
        for module, name in _imported_names(tree, path):
            if module in STAGES and (module, name) not in argument_types:
                offenders.append(f"{rel}: imports engine.{module}" + (f".{name}" if name != "*" else ""))
    assert not offenders, "\n".join(offenders)
