"""Shared test helpers: where the fixtures live, how a missing fixture is reported, and the two tiers.

Fixture-driven tests take the root from ``PRIMESPEECH_FIXTURES`` (default ``../shared/fixtures``
relative to the repository). When a fixture is missing the test is skipped with a reason, except when
``PRIMESPEECH_REQUIRE_FIXTURES=1`` (CI), where a missing fixture is a failure.

Tiers: ``python -m pytest`` runs the quick tier: every module, the fixture parity tests on a seeded sample of
the case files' rows (:func:`sample_cases`: every case file, language and category, ``PRIMESPEECH_CASE_SEED``
picks which rows), and deselects the tests marked ``slow``. ``python -m pytest --full`` runs everything: every
row of every case file and the slow tests. ``-m`` with a marker expression selects by markers as usual instead of
the slow deselection (``-m slow``: only the slow tests).
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import signal
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import TypeVar

import pytest

REPO = Path(__file__).resolve().parents[1]
_SHARED = REPO.parent / "shared"

# Offline data for the English front end and the original dictionaries, when the checkout has
# ../shared beside it (developers' machines and CI). Users' clones download their own data.
if "NLTK_DATA" not in os.environ and (_SHARED / "nltk_data").is_dir():
    os.environ["NLTK_DATA"] = str(_SHARED / "nltk_data")
if "PRIMESPEECH_TEXT_DATA" not in os.environ and (_SHARED / "data" / "gpt-sovits-text").is_dir():
    os.environ["PRIMESPEECH_TEXT_DATA"] = str(_SHARED / "data" / "gpt-sovits-text")
# Engines built from the environment compute a voice's reference features themselves (tests count those computations
# and replay the original's arrays into them); tests/engine/test_reference_cache.py switches the on-disk cache on, with
# a folder of its own. (Settings built from a test's own table, Settings.from_env({...}), keep the default: on.)
os.environ.setdefault("PRIMESPEECH_REFERENCE_CACHE", "0")
# Likewise the models' prepared forms on disk (convert/load.py): engines built from the environment load the float32
# files; tests/convert/test_prepared.py switches them on, with folders of its own.
os.environ.setdefault("PRIMESPEECH_PREPARED_CACHE", "0")


def load_text_data():
    """The text front end's data for tests (:class:`~dora_primespeech_mlx.text.options.TextData`), from the
    environment this module sets (``PRIMESPEECH_TEXT_DATA``, ``PRIMESPEECH_MODEL_DIR``, ``PRIMESPEECH_G2PW``);
    the same value every call. For module-level use; tests take the ``text_data`` fixture."""
    from dora_primespeech_mlx.settings import Settings
    from dora_primespeech_mlx.text.options import TextData

    return TextData.from_settings(Settings.from_env())


def text_data_env() -> dict[str, str]:
    """The settings that give a :class:`~dora_primespeech_mlx.settings.Settings` built from a table of its own
    (``Settings.from_env({...})``) the tests' text front-end data: ``PRIMESPEECH_TEXT_DATA`` when this
    environment has it (empty otherwise: the model directory's ``text-data``, downloaded on first use)."""
    folder = os.environ.get("PRIMESPEECH_TEXT_DATA")
    return {"PRIMESPEECH_TEXT_DATA": folder} if folder else {}


@pytest.fixture(scope="session", name="text_data")
def text_data_fixture():
    """The text front end's data (see :func:`load_text_data`)."""
    return load_text_data()


# The models package gives MLX the fast CBLAS the package runs with (``_blas.preload``). That has to happen
# before any test module imports mlx; otherwise MLX keeps the netlib reference BLAS for the whole session, and
# float32 results (other summation orders) would depend on which test file happens to be collected first.
import dora_primespeech_mlx.models  # noqa: E402, F401

# Every process a test starts inherits this mark (through os.environ), however far down (dora daemons pass their
# environment to the nodes they spawn): the session looks for marked dora processes that outlive it.
SESSION_MARK = "PRIMESPEECH_TEST_SESSION"
os.environ[SESSION_MARK] = uuid.uuid4().hex
SURVIVOR_GRACE_S = 5.0


def dora_processes(mark: str | None = None) -> dict[int, str]:
    """Live processes carrying this session's mark that belong to dora: the dora CLI, coordinator and daemons,
    ``dora-primespeech-mlx``, and every node a daemon spawned (``DORA_NODE_CONFIG`` in its environment).
    pid -> command line; empty where there is no /proc."""
    wanted = f"{SESSION_MARK}={mark or os.environ[SESSION_MARK]}".encode()
    found = {}
    for entry in Path("/proc").glob("[0-9]*"):
        if int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            if wanted not in env or (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError):
            continue  # gone meanwhile, or not ours to read
        if "dora" in cmd or any(v.startswith(b"DORA_NODE_CONFIG=") for v in env):
            found[int(entry.name)] = cmd
    return found


@pytest.fixture(scope="session", autouse=True)
def no_dora_process_survives():
    """At the end of the session no dora process started by a test may be left: survivors (after a grace of
    SURVIVOR_GRACE_S) are SIGKILLed and the session fails, naming them."""
    yield
    deadline = time.monotonic() + SURVIVOR_GRACE_S
    while (left := dora_processes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if left:
        listing = "\n  ".join(f"{pid}: {cmd[:200]}" for pid, cmd in sorted(left.items()))
        pytest.fail(f"{len(left)} dora process(es) outlived the tests that started them (now killed):\n  {listing}",
                    pytrace=False)


@pytest.fixture(autouse=True)
def one_dora_test_at_a_time(request, tmp_path_factory):
    """The tests run in two worker processes (pytest-xdist: ``-n 2`` in pyproject's addopts; ``-n 0``: one
    process). A test that starts dora processes (marked ``dora``: a dataflow's daemon, coordinator and nodes) holds
    a lock the workers share while it runs, so no two dataflows of the tests run at once, as in one process. (A
    module-scoped fixture such as test_cluster's loopback cluster may exist in both workers: it takes free ports.)"""
    if request.node.get_closest_marker("dora") is None or not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    with open(tmp_path_factory.getbasetemp().parent / "dora-tests.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


T = TypeVar("T")
_RUN = {"full": False}


def pytest_addoption(parser):
    parser.addoption(
        "--full", action="store_true", default=False,
        help="run every test: all rows of the fixture case files and the tests marked slow (default: the quick "
             "tier, a seeded sample of rows and no slow tests)",
    )


def pytest_configure(config):
    _RUN["full"] = bool(config.getoption("--full"))


# .ci/run runs the quick tier, then the full tier without the tests that already passed in it: the quick tier
# writes the ids of its passed tests to $PRIMESPEECH_PASSED_IDS_OUT; a run given $PRIMESPEECH_SKIP_IDS deselects
# those ids (the full tier's remaining rows, the slow tests and the wheel check run), but for the tests marked
# ``tiered`` (they do more under --full). Case rows are parametrized by their ids, the same in both tiers.
_PASSED: list[str] = []


def pytest_runtest_logreport(report):
    if report.when == "call" and report.passed and os.environ.get("PRIMESPEECH_PASSED_IDS_OUT"):
        _PASSED.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    out = os.environ.get("PRIMESPEECH_PASSED_IDS_OUT")
    if out and exitstatus == 0 and not os.environ.get("PYTEST_XDIST_WORKER"):  # the controller has every report
        Path(out).write_text("\n".join(_PASSED) + "\n", encoding="utf-8")


def _skip_ids() -> set[str]:
    path = os.environ.get("PRIMESPEECH_SKIP_IDS")
    return set(Path(path).read_text(encoding="utf-8").split()) if path else set()


def full_run() -> bool:
    """True under ``--full``: every case row, the slow tests included."""
    return _RUN["full"]


def pytest_collection_modifyitems(config, items):
    skip = _skip_ids()
    if skip:  # (a test marked tiered does more under --full: it runs again)
        done = [item for item in items if item.nodeid in skip and not item.get_closest_marker("tiered")]
        config.hook.pytest_deselected(items=done)
        items[:] = [item for item in items if item not in done]
    if full_run() or config.option.markexpr:  # -m chooses by markers itself (-m slow: the slow tests)
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


def pytest_report_header(config):
    if full_run():
        return "primespeech tests: full tier (every case row, slow tests included)"
    return (f"primespeech tests: quick tier (seeded sample of case rows, seed {case_seed()}; slow tests deselected: "
            "--full runs everything)")


def case_seed() -> int:
    return int(os.environ.get("PRIMESPEECH_CASE_SEED", "0"))


def sample_cases(items: Sequence[T], group: Callable[[T], Hashable], per_group: int = 1) -> list[T]:
    """Every item under ``--full``; otherwise ``per_group`` items of each group (``group(item)``, e.g. the case
    file, language and category of a row) drawn with ``PRIMESPEECH_CASE_SEED`` (default 0), in file order. The
    draw depends only on the items and the seed, so tests parametrized from the same rows sample the same rows."""
    items = list(items)
    if full_run() or not items:
        return items
    groups: dict[Hashable, list[int]] = defaultdict(list)
    for i, item in enumerate(items):
        groups[group(item)].append(i)
    rng = random.Random(case_seed())
    chosen: set[int] = set()
    for key in sorted(groups, key=repr):
        members = groups[key]
        chosen.update(rng.sample(members, min(per_group, len(members))))
    return [item for i, item in enumerate(items) if i in chosen]


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


def case_rows(relpath: str) -> list[dict]:
    """The rows of a JSONL case file the parity tests run: every row under ``--full``, else a seeded sample of
    one row per (language, category) of the file (:func:`sample_cases`)."""
    return sample_cases(load_jsonl(relpath), lambda row: (row.get("language"), row.get("category")))


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
