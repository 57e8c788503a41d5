"""Metadata the node cannot echo as it came, under a real ``dora run``: a ``segment_index`` beyond int64 (which
made every send raise ``OverflowError``: no audio, no status, no answer) and oversized values; every text gets
exactly one ``segment_complete``, with its ``question_id``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from metadata_sender import CASES
from test_dora import BIN, _dora, tail
from tiny_voice import VOICE, make_model_dir

from dora_primespeech_mlx.settings import ZENOH_OVERLAY

pytestmark = [pytest.mark.dora]

FLOW = """\
nodes:
  - id: sender
    path: {sender}
    inputs:
      segment_complete:
        source: primespeech/segment_complete
        queue_size: 1000
      status:
        source: primespeech/status
        queue_size: 1000
    outputs: [text]
    env:
      OUT: {out}
  - id: primespeech
    path: dora-primespeech-mlx
    inputs:
      text:
        source: sender/text
        queue_size: 1000
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


def test_oversized_metadata_is_answered_under_dora(tmp_path):
    shared = Path(__file__).resolve().parents[3] / "shared"
    flow = tmp_path / "dataflow.yaml"
    flow.write_text(FLOW.format(
        sender=Path(__file__).with_name("metadata_sender.py"), out=tmp_path / "answers.json", voice=VOICE,
        model_dir=make_model_dir(tmp_path / "models"), nltk=os.environ.get("NLTK_DATA", shared / "nltk_data"),
        text_data=os.environ.get("PRIMESPEECH_TEXT_DATA", shared / "data" / "gpt-sovits-text")), encoding="utf-8")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "DORA_ZENOH_CONFIG_OVERLAY": str(ZENOH_OVERLAY)}
    proc = subprocess.Popen([_dora(), "run", str(flow)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    result = tmp_path / "answers.json"
    assert result.exists(), tail(output)
    answers = json.loads(result.read_text(encoding="utf-8"))
    print(json.dumps(answers)[:2000])
    assert [a["question_id"] for a in answers] == list(CASES)
    assert all(a["outcome"] == "completed" for a in answers), answers
    by_id = {a["question_id"]: a for a in answers}
    assert by_id["index-1e308"]["segment_index"] == "1e308"
    assert by_id["index-2p63"]["segment_index"] == "9223372036854775808"
    assert "note" not in by_id["long-string"]["keys"] and "ids" not in by_id["long-list"]["keys"]
    assert "metadata not echoed as sent" in output
