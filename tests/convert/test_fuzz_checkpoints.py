"""The structure-aware checkpoint fuzzer (``tests/tools/fuzz_checkpoints.py``) in the suite: a fixed seed and a few
thousand cases (valid torch.save archives with mutated tensor geometry, pickle opcodes, persistent ids and zip
headers), run in worker subprocesses. Every case loads or raises ``CheckpointError``, within the time and memory
bounds, and no payload runs. Longer runs: ``python tests/tools/fuzz_checkpoints.py --cases 100000 --seed 7``."""

from __future__ import annotations

import json

from tests.tools.fuzz_checkpoints import KINDS, MAX_RSS_MB, fuzz

SEED = 20261125
CASES = 3000  # ~8 s of CPU time over two workers (35 s wall measured on a 2-core machine at load average 11)


def test_fuzzed_checkpoints_load_or_are_refused_clearly():
    report = fuzz(CASES, SEED, batch=750, workers=2)
    print(report.summary())
    assert not report.failures, "\n".join(json.dumps(f) for f in report.failures[:10])
    assert report.cases == CASES
    assert set(report.by_kind) == set(KINDS)
    for kind, outcomes in report.by_kind.items():  # every layer's mutations reach both ends of the reader
        assert outcomes.get("refused", 0) > 0 and outcomes.get("loaded", 0) > 0, (kind, outcomes)
    assert 0 < report.max_rss_mb <= MAX_RSS_MB


def test_the_harness_reports_a_crashing_case(monkeypatch):
    """A worker killed by a signal mid-batch is a failure naming the case it died on (not a lost batch)."""
    monkeypatch.setenv("FUZZ_SELF_TEST_CRASH_AT", "7")
    report = fuzz(10, SEED, batch=10, workers=1)
    crashes = [f for f in report.failures if f["outcome"] == "crash"]
    assert len(crashes) == 1 and crashes[0]["index"] == 7 and "-11" in crashes[0]["detail"]
    assert report.cases == 7
