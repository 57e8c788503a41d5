"""The package's import graph: no cycle, and layers only point downward.

Every module of ``dora_primespeech_mlx`` is parsed with ``ast`` (nothing is imported), and every import
statement becomes an edge: module level and inside functions, ``TYPE_CHECKING`` blocks included,
relative and absolute. ``from pkg import name`` points at ``pkg.name`` when that is a module, else at
``pkg``. Layers (by module-name prefix, so an ``engine/`` package counts like ``engine.py``):

- ``text`` (front end) and ``models`` (pure model math) never import the engine/node layer
  (``engine``, ``node``, ``dataflow``, ``assets``, ``settings``, ``cli``, ``bench``);
- ``text`` imports no model code (``models``, ``convert``, ``coreml``) and ``models`` no loader
  (``convert``) nor the CoreML runtime;
- inside ``models``, a folder per network (``gpt``, ``sovits``, ``hubert``, ``bert``, ``sv``) imports no other
  network, and the shared pieces (``shared``, ``kernels``, ``audio``) import no network;
- a package import inside a function has one of the reasons in :func:`lazy_reason` (an entry point, keeping MLX
  out of a non-MLX module's import, an optional backend or language); every other import is at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "dora_primespeech_mlx"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

ENGINE_LAYER = ("engine", "node", "dataflow", "assets", "settings", "cli", "bench")
FORBIDDEN = {
    "text": ENGINE_LAYER + ("models", "convert", "coreml"),
    "models": ENGINE_LAYER + ("convert", "coreml"),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _resolve(current: str, is_package: bool, level: int, module: str | None) -> str:
    """Absolute name of ``from <level dots><module> import ...`` written in module ``current``."""
    if level == 0:
        return module or ""
    base = current.split(".") if is_package else current.split(".")[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([module] if module else []))


def _owner(name: str, known: dict[str, Path]) -> str | None:
    """The package module ``name`` refers to: itself, or its nearest enclosing known module."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports (anywhere in its body)."""
    known = modules()
    graph: dict[str, set[str]] = {m: set() for m in known}
    for mod, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(mod, is_package, node.level, node.module)
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
            for target in targets:
                if target == PACKAGE or target.startswith(PACKAGE + "."):
                    owner = _owner(target, known)
                    if owner is not None and owner != mod:
                        graph[mod].add(owner)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_graph_sees_the_package():
    graph = import_graph()
    assert f"{PACKAGE}.models.gpt.model" in graph and f"{PACKAGE}.text.frontend" in graph
    assert any(graph.values()), "no import edge found: the parser is broken"
    assert f"{PACKAGE}.models.gpt.model" in graph[f"{PACKAGE}.convert.load"]  # a function-local import


def test_no_import_cycle():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_layers_point_downward():
    graph = import_graph()
    bad = []
    for mod, targets in sorted(graph.items()):
        forbidden = FORBIDDEN.get(_layer_of(mod) or "", ())
        bad += [f"{mod} -> {t}" for t in sorted(targets) if _layer_of(t) in forbidden]
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


NETWORKS = ("gpt", "sovits", "hubert", "bert", "sv")
SHARED = ("shared", "kernels", "audio")


def _model_part(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "models" else None


def test_model_networks_stand_apart():
    """Each network's folder uses only the shared pieces; the shared pieces use no network."""
    bad = []
    for mod, targets in sorted(import_graph().items()):
        part = _model_part(mod)
        if part is None:
            continue
        for t in sorted(targets):
            other = _model_part(t)
            if other in NETWORKS and other != part:
                bad.append(f"{mod} -> {t}")
    assert not bad, "a network's folder or a shared piece imports another network:\n" + "\n".join(bad)


def test_models_folder_is_grouped_by_network():
    folder = ROOT / "models"
    loose = sorted(p.stem for p in folder.glob("*.py") if p.stem not in ("__init__",) + SHARED)
    assert not loose, f"modules outside a network's or the shared folders: {loose}"
    assert all((folder / name / "__init__.py").is_file() for name in NETWORKS + SHARED[:2])


def test_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert find_cycles(graph) == [["a", "b", "c"]]


def test_resolve_relative_imports():
    assert _resolve(f"{PACKAGE}.models.gpt.model", False, 1, "kv_cache") == f"{PACKAGE}.models.gpt.kv_cache"
    assert _resolve(f"{PACKAGE}.models.gpt.model", False, 2, "shared") == f"{PACKAGE}.models.shared"
    assert _resolve(f"{PACKAGE}.models.gpt.model", False, 3, "paths") == f"{PACKAGE}.paths"
    assert _resolve(f"{PACKAGE}.engine", True, 1, "cache") == f"{PACKAGE}.engine.cache"
    assert _resolve(f"{PACKAGE}.engine", True, 2, "models.gpt") == f"{PACKAGE}.models.gpt"


# -- imports inside functions ------------------------------------------------------------------------------------
# A package import inside a function hides a dependency from the top of the module, so each one needs a reason.
# The reasons that hold (anything else is written at the top of its module):
ENTRY_POINTS = ("cli", "cli_checks", "coreml.cli", "node", "bench")  # a subcommand / the node loads what it uses
MLX_LAYERS = ("models", "engine", "bench")  # importing these loads MLX (tests/test_side_effects.py)
OPTIONAL = {  # importer -> modules loaded only when their backend or language is chosen
    "engine.encoders": ("coreml",),  # CoreML: macOS only
    "text.frontend": ("text.chinese", "text.japanese", "text.korean", "text.cantonese", "text.english"),
    "models.sovits.vocoder": ("models.sovits.vocoder_openvino",),  # the openvino extra
    "models.kernels.half_gemv": ("models.kernels.half_matrix",),  # the old name of HalfMatrix (module __getattr__)
}


def _under(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def function_imports() -> list[tuple[str, int, str]]:
    """(module, line, imported package module) of every package import inside a function (names relative to
    the package)."""
    known = modules()
    out = []
    for mod, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom):
                    base = _resolve(mod, is_package, node.level, node.module)
                    targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
                elif isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                else:
                    continue
                for target in targets:
                    owner = _owner(target, known) if target.startswith(PACKAGE) else None
                    if owner is not None and owner != mod:
                        out.append((mod.removeprefix(PACKAGE + "."), node.lineno, owner.removeprefix(PACKAGE + ".")))
    return sorted(set(out))


def lazy_reason(importer: str, target: str) -> str | None:
    """Why ``importer`` may import ``target`` inside a function, or None."""
    if _under(importer, ENTRY_POINTS):
        return "entry point"
    if _under(target, MLX_LAYERS) and not _under(importer, MLX_LAYERS):
        return "keeps MLX out of the importer's import"
    if _under(target, OPTIONAL.get(importer, ())):
        return "optional backend or language"
    return None


def test_imports_inside_functions_have_a_reason():
    found = function_imports()
    assert any(m == "convert.load" and t == "models.gpt.model" for m, _, t in found), "the scan is broken"
    bad = [f"{PACKAGE}.{m}:{line} imports {t}" for m, line, t in found if lazy_reason(m, t) is None]
    assert not bad, "package imports inside functions without a reason (move them to the top):\n" + "\n".join(bad)


def test_lazy_reason_rules():
    assert lazy_reason("engine.pipeline", "models.gpt.generate") is None  # same MLX side: at the top
    assert lazy_reason("text.frontend", "text.llm") is None
    assert lazy_reason("convert.load", "models.gpt.model") is not None
    assert lazy_reason("dataflow.speech", "engine.batching") is not None
    assert lazy_reason("cli", "engine") is not None
    assert lazy_reason("engine.encoders", "coreml.runtime") is not None
    assert lazy_reason("engine.store", "coreml.runtime") is None


def test_the_package_imports_no_torch():
    """No module of the package imports PyTorch, anywhere in its body (the original's side of the conversation
    bench lives in tests/tools/conversation_upstream.py)."""
    bad = []
    for mod, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            bad += [f"{mod}:{node.lineno} imports {n}" for n in names if n == "torch" or n.startswith("torch.")]
    assert not bad, "\n".join(bad)
