"""Send order under a real ``dora run`` with a control backlog: dora 1.1 delivers the queued ``text`` and
``control`` events alternately, so the text sent after a ``reset`` reaches the node before the reset does. The
node orders them by dora's send timestamp: the reset cancels the text sent before it, never the one after it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from test_dora import BIN, _dora, tail
from tiny_voice import VOICE, make_model_dir

from dora_primespeech_mlx.dataflow.handler import CANCELLED
from dora_primespeech_mlx.settings import ZENOH_OVERLAY

pytestmark = [pytest.mark.slow, pytest.mark.dora]

FLOW = """\
nodes:
  - id: sender
    path: {sender}
    inputs:
      segment_complete:
        source: primespeech/segment_complete
        queue_size: 10000
      status:
        source: primespeech/status
        queue_size: 10000
    outputs: [text, control]
    env:
      OUT: {out}
      ROUNDS: "{rounds}"
      BURST: "{burst}"
  - id: primespeech
    path: dora-primespeech-mlx
    inputs:
      text:
        source: sender/text
        queue_size: 10000
      control:
        source: sender/control
        queue_size: 10000
    outputs: [audio, segment_complete, status, log]
    env:
      VOICE_NAME: {voice}
      PRIMESPEECH_MODEL_DIR: {model_dir}
      GPTSVITS_WARMUP: "false"
      TOP_K: 1
      LOG_LEVEL: INFO
      NLTK_DATA: {nltk}
      PRIMESPEECH_TEXT_DATA: {text_data}
"""


def test_reset_under_a_control_backlog_never_cancels_a_later_text(tmp_path):
    rounds = 3
    shared = Path(__file__).resolve().parents[3] / "shared"
    flow = tmp_path / "dataflow.yaml"
    flow.write_text(FLOW.format(
        sender=Path(__file__).with_name("order_sender.py"), out=tmp_path / "answers.json", rounds=rounds, burst=300,
        voice=VOICE, model_dir=make_model_dir(tmp_path / "models"),
        nltk=os.environ.get("NLTK_DATA", shared / "nltk_data"),
        text_data=os.environ.get("PRIMESPEECH_TEXT_DATA", shared / "data" / "gpt-sovits-text")), encoding="utf-8")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "DORA_ZENOH_CONFIG_OVERLAY": str(ZENOH_OVERLAY)}
    proc = subprocess.Popen([_dora(), "run", str(flow)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    result = tmp_path / "answers.json"
    assert result.exists(), tail(output)
    data = json.loads(result.read_text(encoding="utf-8"))
    answers = data["answers"]
    resets = [s.get("cancelled") for s in data["statuses"] if s.get("status") == "reset"]
    print(f"answers {answers}; texts cancelled per reset {resets}")
    assert len(resets) == rounds
    for i in range(rounds):
        assert answers[f"after-{i}"] == "completed", (i, answers)  # sent after its reset: never cancelled by it
        assert answers[f"before-{i}"] in ("completed", CANCELLED), (i, answers)
