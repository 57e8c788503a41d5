"""Shared test helpers: where the fixtures live and how a missing fixture is reported.

Fixture-driven tests take the root from ``PRIMESPEECH_FIXTURES`` (default ``../shared/fixtures``
relative to the repository). When a fixture is missing the test is skipped with a reason, except when
``PRIMESPEECH_REQUIRE_FIXTURES=1`` (CI), where a missing fixture is a failure.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_SHARED = REPO.parent / "shared"

# Offline data for the English front end and the original dictionaries, when the checkout has
# ../shared beside it (developers' machines and CI). Users' clones download their own data.
if "NLTK_DATA" not in os.environ and (_SHARED / "nltk_data").is_dir():
    os.environ["NLTK_DATA"] = str(_SHARED / "nltk_data")
if "PRIMESPEECH_TEXT_DATA" not in os.environ and (_SHARED / "data" / "gpt-sovits-text").is_dir():
    os.environ["PRIMESPEECH_TEXT_DATA"] = str(_SHARED / "data" / "gpt-sovits-text")

# The models package gives MLX the fast CBLAS the package runs with (``_blas.preload``). That has to happen
# before any test module imports mlx; otherwise MLX keeps the netlib reference BLAS for the whole session, and
# float32 results (other summation orders) would depend on which test file happens to be collected first.
import dora_primespeech_mlx.models  # noqa: E402, F401


def fixtures_root() -> Path:
    return Path(os.environ.get("PRIMESPEECH_FIXTURES", str(_SHARED / "fixtures"))).expanduser().resolve()


def fixtures_required() -> bool:
    return os.environ.get("PRIMESPEECH_REQUIRE_FIXTURES", "").strip().lower() in {"1", "true", "yes", "on"}


def require_fixture(relpath: str | os.PathLike) -> Path:
    """Return the fixture path, or skip (fail in CI) when it is absent."""
    path = fixtures_root() / relpath
    if not path.exists():
        msg = f"fixture {path} not found (set PRIMESPEECH_FIXTURES)"
        if fixtures_required():
            pytest.fail(msg + " and PRIMESPEECH_REQUIRE_FIXTURES=1", pytrace=False)
        pytest.skip(msg)
    return path


def load_jsonl(relpath: str) -> list[dict]:
    """Rows of a JSONL fixture; an empty list (at collection time) when it is absent."""
    path = fixtures_root() / relpath
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_cases_json() -> dict:
    path = fixtures_root() / "models" / "cases.json"
    if not path.exists():
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def model_cases(prefix: str | None = None) -> list[dict]:
    """Every case of models/cases.json (optionally those whose name starts with ``prefix``)."""
    cases = load_cases_json().get("cases", [])
    return [c for c in cases if prefix is None or c["name"].startswith(prefix)]


def param_or_missing(items: list, ids, what: str):
    """pytest parameters for ``items``; when the fixture file is absent, one ``None`` parameter whose
    test must call :func:`require_case` (it then skips, or fails in CI)."""
    if items:
        return [pytest.param(i, id=ids(i)) for i in items]
    return [pytest.param(None, id=f"missing:{what}")]


def require_case(case, relpath: str):
    """Pass-through for a real case; skip/fail for the placeholder of a missing fixture file."""
    if case is None:
        require_fixture(relpath)
        pytest.fail(f"{relpath} exists but has no cases", pytrace=False)
    return case
