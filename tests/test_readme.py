"""The README documents what the code does: the settings table and the commands it names."""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

from dora_primespeech_mlx import settings

README = Path(__file__).resolve().parents[1] / "README.md"
START, END = "<!-- settings-table:", "<!-- /settings-table -->"
MAX_LINES, MAX_WIDTH = 300, 120


def _default(value) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, Path):
        return "`~/.dora/models/primespeech`"
    return f"`{value}`"


def settings_table() -> str:
    """One wrapped list item per setting (a table's rows would run far past the README's line width)."""
    rows = []
    for name, aliases, default, meaning in settings.describe():
        alias = f" (or {', '.join(f'`{a}`' for a in aliases)})" if aliases else ""
        item = f"- `{name}` = {_default(default)}{alias}: {meaning}"
        rows += textwrap.wrap(item, MAX_WIDTH, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)
    return "\n".join(rows)


def _current_table(text: str) -> str:
    start = text.index(START)
    start = text.index("\n", start) + 1
    return text[start : text.index(END)].strip()


def test_settings_table_matches_code():
    text = README.read_text(encoding="utf-8")
    assert _current_table(text) == settings_table(), "run: python tests/test_readme.py --write"


def test_every_setting_documented():
    text = README.read_text(encoding="utf-8")
    for name, aliases, _default_value, meaning in settings.describe():
        assert meaning.strip(), name
        assert f"`{name}`" in text
        for alias in aliases:
            assert f"`{alias}`" in text


def test_cli_commands_in_readme_exist():
    from dora_primespeech_mlx.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    documented = set(re.findall(r"primespeech-mlx ([a-z-]+)", README.read_text(encoding="utf-8")))
    assert documented <= set(sub.choices), documented - set(sub.choices)


if __name__ == "__main__" and "--write" in sys.argv:
    text = README.read_text(encoding="utf-8")
    head, rest = text.split(START, 1)
    marker_line, _, rest = rest.partition("\n")
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{START}{marker_line}\n{settings_table()}\n{END}{tail}", encoding="utf-8")
