"""ReDoS guard: every regular expression of the package goes through regexploit's analyser
(https://github.com/doyensec/regexploit), which finds patterns whose backtracking grows with the cube of the
input or worse (adjacent or nested quantifiers over the same characters: the LLM stage's code-fence pattern was
one, two minutes on a 5 000-character message). Quadratic growth, which it does not report, is
test_linear_time.py's business.

The patterns are collected while the package runs: every module is imported and the text stages are run on a
sample with ``re``'s compile step recorded, so patterns built from f-strings are seen as compiled. A source scan
keeps the collection complete: each ``re.<function>(...)`` call in the package must have a literal pattern or
have been seen compiling."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import sys
from pathlib import Path

import pytest

import dora_primespeech_mlx as pkg

regexploit_sre = pytest.importorskip("regexploit.ast.sre", reason="regexploit (the [dev] extra) is not installed")
from regexploit.redos import find  # noqa: E402

ROOT = Path(pkg.__file__).resolve().parent
_RE_FUNCTIONS = {"compile", "search", "match", "fullmatch", "sub", "subn", "split", "findall", "finditer"}
#: call sites whose pattern is neither a literal nor compiled on import or by the text stages' sample run,
#: with what the pattern is: (file relative to the package, function) -> reason
UNCHECKED: dict[tuple[str, str], str] = {
    ("convert/checkpoints.py", "sv_config"): r'rf"layer{stage}\.(\d+)\." (stage 1-4): no quantifier can overlap',
    # compiled once per process (cached), so seen only when no earlier test loaded the Korean front end
    ("text/korean.py", "_load"): "g2pk2's own table rules, compiled once: a third-party library's patterns",
}

_SAMPLE = [
    "<think>让我想想。</think>**你好**，访问 https://example.com/a?b=c 或写信给 a.b@example.com。",
    "# Title\n\n1. Update numpy to 2.0\n2) Restart\n- item\n> quote\n```python\nx = 1\n```\n| a | b |\n|---|---|\n"
    "| 1 | 2 |\n<tool_call>{}</tool_call> ~~~\nok\n~~~ done <b>bold</b> &amp; ![alt](x.png) [t](http://x.io)",
    "今天是2024年3月15日，温度-3°C，电话13812345678，比例3/4，12.5%，1~2个。",
    "Hello, it's 10:30 and $12.50 or £7.99; 3 + 4 = 7, 1st, 3.5, NASA, e.g. this.",
    "こんにちは、今日は2024年です。안녕하세요. 你好，我係你嘅助手。",
]


def _call_sites() -> list[tuple[str, int, int, str, ast.expr | None]]:
    """(file, first line, last line, enclosing function, pattern argument) of every ``re.X(...)`` call."""
    sites = []
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text("utf-8"))
        func_of: dict[int, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for inner in ast.walk(node):
                    func_of.setdefault(id(inner), node.name)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "re"
                    and node.func.attr in _RE_FUNCTIONS):
                arg = node.args[0] if node.args else None
                sites.append((str(path.relative_to(ROOT)), node.lineno, node.end_lineno or node.lineno,
                              func_of.get(id(node), "<module>"), arg))
    return sites


def _recorded() -> dict[tuple[str, int], set[tuple[str, int]]]:
    """(file, line) -> {(pattern, flags)} compiled there while every module is imported and the stages run."""
    seen: dict[tuple[str, int], set[tuple[str, int]]] = {}
    original = re._compile

    def record(pattern, flags):
        frame = sys._getframe(1)
        while frame is not None and Path(frame.f_code.co_filename).parent.name == "re":
            frame = frame.f_back
        if frame is not None and isinstance(pattern, str):
            path = Path(frame.f_code.co_filename).resolve()
            if ROOT in path.parents:
                key = (str(path.relative_to(ROOT)), frame.f_lineno)
                seen.setdefault(key, set()).add((pattern, int(flags)))
        return original(pattern, flags)

    names = [m.name for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")]
    fresh = [n for n in names if n not in sys.modules]
    re._compile = record
    try:
        for name in names:  # already imported modules run their module-level compiles again in a reload
            try:
                module = importlib.import_module(name)
                if name not in fresh and ROOT in Path(module.__file__ or "").resolve().parents:
                    _reexec(module)
            except Exception:  # noqa: BLE001 - a module needing an absent optional library
                continue
        _run_stages()
    finally:
        re._compile = original
    return seen


def _reexec(module) -> None:
    """Run a module's source again in a scratch namespace: its module-level compiles are recorded without
    replacing the imported module's objects."""
    source = Path(module.__file__).read_text("utf-8")
    namespace = {"__name__": module.__name__ + "._redos_scan", "__package__": module.__package__,
                 "__file__": module.__file__}
    exec(compile(source, module.__file__, "exec"), namespace)  # noqa: S102 - the package's own source


def _run_stages() -> None:
    from conftest import load_text_data

    from dora_primespeech_mlx.text import get_phones, split_languages, split_text
    from dora_primespeech_mlx.text.llm import StreamFilter, clean

    data = load_text_data()
    stages = (clean, lambda t: StreamFilter().feed(t), lambda t: split_languages(t, "auto"),
              lambda t: split_text(t, "cut5", "zh"), lambda t: get_phones(clean(t), "auto", data=data))
    for text in _SAMPLE:
        for stage in stages:
            try:
                stage(text)
            except Exception:  # noqa: BLE001 - only the compiles matter here
                pass


@pytest.fixture(scope="module")
def patterns_and_sites():
    recorded = _recorded()
    return recorded, _call_sites()


def test_every_pattern_call_is_checked(patterns_and_sites):
    recorded, sites = patterns_and_sites
    missing = []
    for file, first, last, func, arg in sites:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            continue
        if any((file, line) in recorded for line in range(first, last + 1)) or (file, func) in UNCHECKED:
            continue
        missing.append(f"{file}:{first} in {func}")
    assert not missing, ("pattern calls neither literal nor seen compiling (run them from _SAMPLE or list them in "
                         "UNCHECKED): " + ", ".join(missing))


def test_no_pattern_backtracks_cubically(patterns_and_sites):
    recorded, sites = patterns_and_sites
    patterns = {p for found in recorded.values() for p in found}
    patterns |= {(arg.value, 0) for *_, arg in sites if isinstance(arg, ast.Constant) and isinstance(arg.value, str)}
    assert len(patterns) > 100  # the collection works: the package has well over a hundred patterns
    parser = regexploit_sre.SreOpParser()
    bad = []
    for pattern, flags in sorted(patterns):
        for redos in find(parser.parse_sre(pattern, flags)):
            if redos.starriness > 2:  # regexploit's own threshold: cubic or worse
                bad.append(f"{pattern!r}: {redos.example()}")
    assert not bad, "patterns with super-linear backtracking:\n" + "\n".join(bad)
