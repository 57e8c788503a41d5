"""Docstrings say what and why in a few lines; benchmark figures live in docs/, not in code comments.

A module docstring longer than :data:`MAX_MODULE_DOC_LINES` belongs, in its detail, to the class or function it
explains or to a docs/ page. A comment that carries a measurement (a timing next to measured/TTFA/faster/slower,
a speed-up factor, a memory size, a percentage next to slower/faster) goes stale as the code changes; the figure
belongs in docs/performance.md with the command that reproduces it, and the comment says why in words.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "dora_primespeech_mlx"
MAX_MODULE_DOC_LINES = 15

_NUM = r"(?<![\w.])\d+(?:\.\d+)?"
# A timing counts as a measurement when the same comment says it was measured or compares speeds.
TIMING = re.compile(rf"{_NUM}\s?(?:ms|µs|us|s)\b")
TIMING_WORDS = re.compile(r"\b(?:measured|TTFA|faster|slower|took|takes|spinning|bench|threads?)\b|\bvs\.?\s", re.I)
APPROX_MS = re.compile(rf"~\s?{_NUM}\s?(?:ms|µs|us)\b")
SPEEDUP = re.compile(rf"{_NUM}\s?[x×](?![\w])")
MEMORY = re.compile(rf"{_NUM}\s?(?:[MG]i?B)\b")
PERCENT_COMPARED = re.compile(rf"{_NUM}\s?%[^#]*\b(?:slower|faster)\b|\b(?:slower|faster)\b[^#]*{_NUM}\s?%", re.I)

# Specification comments that match a pattern above without being a measurement: (path, text in the comment).
ALLOWED = {
    ("dora_primespeech_mlx/text/zh_normalization/phonecode.py", "Mainland mobile prefixes (13x"),
    ("dora_primespeech_mlx/text/zh_normalization/phonecode.py", "Landlines: optional area code (010, 02x"),
}


def _module_docstring_lines(path: Path) -> int:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False)
    return len(doc.splitlines()) if doc else 0


def _comment_blocks(path: Path) -> list[tuple[int, str]]:
    """(first line, text) of each comment after code, and of each run of whole-line comments on consecutive lines
    (a figure and the word that makes it a measurement are often a line apart)."""
    blocks: list[tuple[int, str]] = []
    last = -2
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline):
        if tok.type != tokenize.COMMENT:
            continue
        line, whole_line = tok.start[0], tok.line.lstrip().startswith("#")
        if not whole_line:
            last = -2
        if blocks and whole_line and line == last + 1:
            blocks[-1] = (blocks[-1][0], f"{blocks[-1][1]} {tok.string.lstrip('#:').strip()}")
        else:
            blocks.append((line, tok.string.lstrip("#:").strip()))
        last = line if whole_line else -2
    return blocks


def benchmark_figure(text: str) -> str | None:
    """The measurement a comment carries, or None."""
    if TIMING.search(text) and TIMING_WORDS.search(text):
        return TIMING.search(text).group(0)
    for pattern in (APPROX_MS, SPEEDUP, MEMORY, PERCENT_COMPARED):
        if m := pattern.search(text):
            return m.group(0)
    return None


def test_module_docstrings_are_short():
    long = {p.relative_to(ROOT.parent).as_posix(): n for p in sorted(ROOT.rglob("*.py"))
            if (n := _module_docstring_lines(p)) > MAX_MODULE_DOC_LINES}
    assert not long, f"module docstrings over {MAX_MODULE_DOC_LINES} lines (move detail to docs/ or to the " \
                     f"class/function it explains): {long}"


def test_no_benchmark_figures_in_comments():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).as_posix()
        for line, text in _comment_blocks(path):
            figure = benchmark_figure(text)
            if figure and not any(rel == p and allowed in text for p, allowed in ALLOWED):
                found.append(f"{rel}:{line}: {figure!r} in {text[:100]!r}")
    assert not found, "benchmark figures in code comments (move them to docs/performance.md with the command " \
                      "that reproduces them):\n" + "\n".join(found)


def test_the_figure_pattern_tells_measurements_from_specifications():
    measured = ["bench VM TTFA 2.14 s at 16", "1.67x / 1.93x at 2 threads", "peak RSS -210 MB",
                "Measured in one run, alternating: 0-1.4 % slower per decode", "2.63 s min spinning vs 1.94 s not",
                "every call recompiled them all (~50 ms a sentence)", "(2 threads, 215 frames: 2-D 0.97-1.00 s)"]
    specified = ["reference audio 3..10 s plus the 0.6 s tail, 1 s steps", "12.5% -> 百分之十二点五",
                 "10%~20%, 3m~5m: the tilde between two numbers", "0x7fff mask",
                 "how long the worker may take to reach a cancellation point (exit within 1 s)",
                 "MD5 of the first 8 KiB of the file"]
    assert all(benchmark_figure(t) for t in measured), [t for t in measured if not benchmark_figure(t)]
    assert not any(benchmark_figure(t) for t in specified), [t for t in specified if benchmark_figure(t)]
