"""Every document the package's docstrings and comments point at is in the repository: a ``*.md`` reference names a file
under the repository root (``docs/x.md``, ``README.md``), and a section named after it (``docs/x.md, "Title"``) is a
heading (or a labelled paragraph) of that file. Before, 31 references pointed at design notes the project does not
contain (``gpt-sovits-v2.md``, ``performance-notes.md``, ``dora-contract.md``)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "dora_primespeech_mlx"
REFERENCE = re.compile(r"(?<![\w/.-])([\w./-]+\.md)(?![\w-])")
# a section named right after a reference: `docs/x.md, "Title"` or `docs/x.md ("Title")`
SECTION = re.compile(r"([\w./-]+\.md)(?:,\s*|\s*\(\s*)\"([^\"]{1,120})\"")


def _texts(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every docstring and comment block of a module, whitespace collapsed."""
    source = path.read_text(encoding="utf-8")
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append((getattr(node, "lineno", 1), " ".join(doc.split())))
    block: list[str] = []
    start = last = 0
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        line = tok.start[0]
        if block and line != last + 1:
            out.append((start, " ".join(" ".join(block).split())))
            block = []
        if not block:
            start = line
        block.append(tok.string.lstrip("#"))
        last = line
    if block:
        out.append((start, " ".join(" ".join(block).split())))
    return out


def _has_section(doc: Path, section: str) -> bool:
    """Whether ``doc`` has a heading that starts with ``section`` ("The levers" names "The levers (all on by
    default)"), or a paragraph or list item labelled with it (``**On OpenVINO.**``, ``- Spinning threads: ...``)."""
    text = doc.read_text(encoding="utf-8")
    s = re.escape(section)
    return bool(re.search(rf"^#{{1,6}}\s+{s}(?:$|[\s(:,])", text, re.MULTILINE)
                or re.search(rf"\*\*{s}[.:]?\*\*", text)
                or re.search(rf"^\s*- {s}:", text, re.MULTILINE))


def references() -> list[tuple[str, str, str | None]]:
    """(where, referenced file, section or None) for every reference in the package."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        for line, text in _texts(path):
            sections = {m.start(1): m.group(2) for m in SECTION.finditer(text)}
            for m in REFERENCE.finditer(text):
                found.append((f"{rel}:{line}", m.group(1), sections.get(m.start(1))))
    return found


def broken(found: list[tuple[str, str, str | None]]) -> list[str]:
    bad = []
    for where, name, section in found:
        target = REPO / name
        if not target.is_file():
            bad.append(f"{where}: {name} is not a file of the repository")
        elif section is not None and not _has_section(target, section):
            bad.append(f"{where}: {name} has no section {section!r}")
    return bad


def test_every_document_reference_resolves():
    found = references()
    assert len(found) > 20 and any(name == "docs/model.md" for _, name, _ in found), "the scan finds nothing"
    assert not broken(found), "references to documents the repository does not have:\n" + "\n".join(broken(found))


def test_the_check_sees_a_missing_file_and_a_missing_heading(tmp_path):
    """The scan reads docstrings and comments (not code: ``hashlib.md5``), and the check fails a reference to a
    missing file and to a missing heading."""
    module = tmp_path / "m.py"
    module.write_text('"""See gpt-sovits-v2.md section 5 and docs/model.md, "No such heading"."""\n'
                      "import hashlib\n# docs/performance.md,\n# \"The stage bench\"\nx = hashlib.md5(b'')\n",
                      encoding="utf-8")
    texts = " ".join(t for _, t in _texts(module))
    refs = [(str(module), m.group(1), {n.start(1): n.group(2) for n in SECTION.finditer(texts)}.get(m.start(1)))
            for m in REFERENCE.finditer(texts)]
    assert [r[1:] for r in refs] == [("gpt-sovits-v2.md", None), ("docs/model.md", "No such heading"),
                                     ("docs/performance.md", "The stage bench")]
    assert len(broken(refs)) == 2
