"""The session's survivor check (tests/conftest.py) sees the dora processes the tests start, however they were
started, and only those."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import SESSION_MARK, dora_processes

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc (Linux)")


def test_marked_dora_processes_are_found_and_others_are_not():
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    env = {k: v for k, v in os.environ.items() if k != SESSION_MARK}
    procs = [
        subprocess.Popen(sleeper),  # ours, but not dora
        subprocess.Popen(sleeper, env={**os.environ, "DORA_NODE_CONFIG": "x"}),  # ours: a node a daemon spawned
        subprocess.Popen([*sleeper, "dora-daemon"], start_new_session=True),  # ours, in a session of its own
        subprocess.Popen([*sleeper, "dora"], env=env),  # not from this session
    ]
    try:
        time.sleep(0.3)
        found = dora_processes()
        assert procs[1].pid in found and procs[2].pid in found
        assert procs[0].pid not in found and procs[3].pid not in found
        assert os.getpid() not in found
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert not {p.pid for p in procs} & set(dora_processes())
