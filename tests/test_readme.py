"""The README documents what the code does: the settings tables and the commands it names.

Each setting is documented once, where its audience reads (settings.AUDIENCES): the dataflow contract in the README,
speed and memory tuning in docs/performance.md, the node's deployment in docs/dataflow.md."""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

from dora_primespeech_mlx import settings

README = Path(__file__).resolve().parents[1] / "README.md"
DOCS = README.parent / "docs"
START, END = "<!-- settings-table:", "<!-- /settings-table -->"
TABLES = {"contract": README, "tuning": DOCS / "performance.md", "deployment": DOCS / "dataflow.md"}
MAX_LINES, MAX_WIDTH = 300, 120


def _default(value) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, Path):
        return "`~/.dora/models/primespeech`"
    return f"`{value}`"


def settings_table(audience: str) -> str:
    """One wrapped list item per setting of ``audience`` (a table's rows would run far past the line width)."""
    rows = []
    for name, aliases, default, meaning in settings.describe(audience):
        alias = f" (or {', '.join(f'`{a}`' for a in aliases)})" if aliases else ""
        item = f"- `{name}` = {_default(default)}{alias}: {meaning}"
        rows += textwrap.wrap(item, MAX_WIDTH, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)
    return "\n".join(rows)


def _current_table(text: str) -> str:
    start = text.index(START)
    start = text.index("\n", start) + 1
    return text[start : text.index(END)].strip()


def test_settings_tables_match_code():
    for audience, page in TABLES.items():
        text = page.read_text(encoding="utf-8")
        assert _current_table(text) == settings_table(audience), f"{page.name}: run python tests/test_readme.py --write"


def test_every_setting_documented_once_for_its_audience():
    assert set(TABLES) == set(settings.AUDIENCES)
    for audience, page in TABLES.items():
        text = page.read_text(encoding="utf-8")
        for name, aliases, _default_value, meaning in settings.describe(audience):
            assert meaning.strip(), name
            assert f"`{name}`" in text, f"{name} is not in {page.name}"
            for alias in aliases:
                assert f"`{alias}`" in text
    readme = _current_table(README.read_text(encoding="utf-8"))
    others = [name for a in ("tuning", "deployment") for name, *_ in settings.describe(a)]
    assert not [n for n in others if f"`{n}`" in readme], "the README's list is the dataflow contract only"
    assert len(settings.describe("contract")) <= 20  # the ones a dataflow author sets; the rest on their pages


def test_cli_commands_in_readme_exist():
    from dora_primespeech_mlx.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for page in _pages():
        documented = set(re.findall(r"primespeech-mlx ([a-z-]+)", page.read_text(encoding="utf-8")))
        assert documented <= set(sub.choices), (page.name, documented - set(sub.choices))


def _setup_commands() -> list[str]:
    """The README's bash lines that set everything up: those that create the venv."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
    return [line for block in blocks for line in block.splitlines() if line.startswith("python3 -m venv")]


def test_two_commands_set_everything_up():
    """One installs what running needs and runs the shipped dataflow, one installs the test tools and runs the
    tests; .ci/run installs with the same two pip commands, in that order."""
    run, test = _setup_commands()  # exactly two
    assert 'pip install ".[dora]"' in run and run.endswith("dora run dataflow.yaml"), run
    assert 'pip install -e ".[dev]"' in test and "python -m pytest" in test, test
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    installs = re.findall(r"^pip install -q (.+)$", ci, re.MULTILINE)
    assert installs[-2:] == ['".[dora]"', '-e ".[dev]"'], installs


# Wording that only makes sense to someone who followed the project's history, never to a reader of the docs.
HISTORY = ("this round", "previous round", "rounds ago", "last round", "issue 1", "issue 2", "main then this branch",
           "this branch", "stale")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def test_readme_is_short_and_narrow():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, f"README has {len(lines)} lines (at most {MAX_LINES}); move detail to docs/"
    wide = [(i + 1, len(line)) for i, line in enumerate(lines) if len(line) > MAX_WIDTH]
    assert not wide, f"README lines over {MAX_WIDTH} characters (line, length): {wide}"


def test_docs_state_facts_without_history():
    for page in _pages():
        text = page.read_text(encoding="utf-8").lower()
        found = [w for w in HISTORY if w in text]
        assert not found, f"{page.name}: {found}"


def test_every_relative_link_resolves():
    for page in _pages():
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            assert dest.exists(), f"{page.name}: link to {target} does not resolve"
            if anchor and dest.suffix == ".md":
                assert anchor in _anchors(dest), f"{page.name}: no heading #{anchor} in {dest.name}"


def test_every_named_file_of_the_repository_exists():
    """Paths such as tests/tools/x.py or models/sovits/conv.py name files of this checkout (package-relative ones under
    dora_primespeech_mlx/); a client repository's path is named as a folder, which this skips."""
    root, package = README.parent, README.parent / "dora_primespeech_mlx"
    top = r"(?:tests|examples|nodes|voices|docs|dora_primespeech_mlx)"
    inner = r"(?:models|engine|text|convert|coreml|bench|dataflow|assets)"
    for page in _pages():
        text = page.read_text(encoding="utf-8")
        for m in re.finditer(rf"(?<![\w/.-])({top}/[\w./-]*\.[a-z0-9]+)\b", text):
            assert (root / m.group(1)).exists(), f"{page.name}: {m.group(1)} does not exist"
        for m in re.finditer(rf"(?<![\w/.-])({inner}/[\w./-]*\.[a-z0-9]+)\b", text):
            assert (package / m.group(1)).exists(), f"{page.name}: {m.group(1)} does not exist"


def test_every_docs_page_is_linked_from_the_readme():
    text = README.read_text(encoding="utf-8")
    for page in sorted(DOCS.glob("*.md")):
        assert f"docs/{page.name}" in text, f"README does not point to docs/{page.name}"


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


if __name__ == "__main__" and "--write" in sys.argv:
    for audience, page in TABLES.items():
        text = page.read_text(encoding="utf-8")
        head, rest = text.split(START, 1)
        marker_line, _, rest = rest.partition("\n")
        _, tail = rest.split(END, 1)
        page.write_text(f"{head}{START}{marker_line}\n{settings_table(audience)}\n{END}{tail}", encoding="utf-8")
