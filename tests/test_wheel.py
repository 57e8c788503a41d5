"""The wheel as a user installs it (tests/wheel_check.py): built, installed non-editable with the README's ``[dora]``
extra into a fresh venv outside the checkout, then ``primespeech-mlx say`` and the venv's ``dora run`` of the shipped
dataflow.yaml from a folder that is not the checkout (a fixture voice offline; one non-silent WAV per question).
Slow (a venv and its dependencies): ``python -m pytest --full``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, require_fixture

pytestmark = [pytest.mark.slow, pytest.mark.dora]


def test_wheel_installs_and_speaks_outside_the_checkout():
    require_fixture("models/cases.json")
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("wheel_check.py"))], cwd=REPO,
                            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=1800)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the script and everything it started
            proc.communicate()
    print(out[-3000:])
    assert proc.returncode == 0, out[-6000:]
    assert "wheel check passed" in out
