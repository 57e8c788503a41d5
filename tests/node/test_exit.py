"""A process that leaves while the handler's worker (which used MLX) is still serving — idle, or in the middle of a
synthesis — exits with its own code: the worker parks at exit (a thread that used MLX and wakes during the
interpreter's finalization aborted the process: "terminate called without an active exception", code 134)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from tiny_voice import make_model_dir

SCRIPT = """
import sys, threading
import pyarrow as pa
from dora_primespeech_mlx.dataflow.handler import MessageHandler
from dora_primespeech_mlx.dataflow.transport import DirectTransport
from dora_primespeech_mlx.node import engine_factory
from dora_primespeech_mlx.settings import Settings

audio = threading.Event()
settings = Settings.from_env()
handler = MessageHandler(settings, engine_factory(settings), DirectTransport(
    lambda output, array, md: audio.set() if output == "audio" else None))
handler.start()
assert handler.ready.wait(600) and handler.startup_error is None, handler.startup_error
if sys.argv[1] == "speaking":
    handler.on_input("text", pa.array([" ".join(["Sentence number one, a small test of leaving."] * 30)]), {})
    assert audio.wait(300)
print("leaving", flush=True)
sys.exit(3)
"""


@pytest.mark.parametrize("state", ["idle", "speaking"])
def test_leaving_with_a_live_worker_keeps_the_exit_code(tmp_path, state):
    env = {**os.environ, "VOICE_NAME": "Tiny", "PRIMESPEECH_MODEL_DIR": str(make_model_dir(tmp_path / "models")),
           "GPTSVITS_WARMUP": "false", "STREAMING": "true", "LOG_LEVEL": "WARNING"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, state], env=env, capture_output=True, text=True,
                          timeout=600)
    output = proc.stdout + proc.stderr
    assert "leaving" in output, output[-3000:]
    assert proc.returncode == 3, output[-3000:]
    assert "terminate called" not in output
