"""STOP in the middle of a streaming synthesis, under a real ``dora run``: the node (both forms) exits at once
with code 0 — its worker is not waited for beyond a short grace — and no wait hangs."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import string
import subprocess
import time
from pathlib import Path

import pytest
from test_dora import BIN, NODE_FORM, OPERATOR_FORM, REPO, TEMPLATE, _dora, tail
from tiny_voice import VOICE, make_model_dir

from dora_primespeech_mlx.settings import ZENOH_OVERLAY

pytestmark = [pytest.mark.dora, pytest.mark.slow]

LONG = "& " + " ".join(f"Sentence number {n}, a small test of stopping." for n in range(1, 60))
# The slowest text found for the front end (tests/node/test_order.py): 60-letter "words" that no dictionary
# has, each read by the compound splitter and the neural predictor (tens of seconds in all).
_RNG = random.Random(0)
SLOW = "& " + json.dumps({"prompt": ". ".join("".join(_RNG.choice(string.ascii_lowercase) for _ in range(60))
                                              for _ in range(78)) + ".", "language": "en"})
NINES = "& " + json.dumps({"prompt": "9" * 4999, "language": "en"})  # issue 24: >200 s, STOP ignored


@pytest.mark.parametrize("form", ["node", "operator", "front-end", "nines"])
def test_stop_mid_stream_exits_at_once_with_code_0(tmp_path, form):
    """``front-end``: STOP while the worker is deep in the text front end on the slowest text found (the node
    form). ``nines``: 5 000 nines as English, which held the GIL in a cubic regex for more than 200 s (the node
    ignored STOP until dora killed it); now the text is refused at once and STOP ends the node."""
    model_dir = make_model_dir(tmp_path / "models")
    script = {"front-end": [SLOW, "@sleep 600"], "nines": [NINES, "@sleep 600"]}.get(
        form, [LONG, LONG, "@wait audio", "@sleep 600"])
    (tmp_path / "script.txt").write_text("\n".join(script) + "\n", encoding="utf-8")
    shared = REPO.parent / "shared"
    flow = tmp_path / "dataflow.yaml"
    flow.write_text(string.Template(TEMPLATE.read_text(encoding="utf-8")).substitute(
        repo=REPO, script=tmp_path / "script.txt", tts=OPERATOR_FORM if form == "operator" else NODE_FORM, voice=VOICE,
        model_dir=model_dir, streaming="true", warmup="false", index_as_str="false", out=tmp_path / "out",
        nltk_data=os.environ.get("NLTK_DATA", shared / "nltk_data"),
        text_data=os.environ.get("PRIMESPEECH_TEXT_DATA", shared / "data" / "gpt-sovits-text")), encoding="utf-8")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "DORA_ZENOH_CONFIG_OVERLAY": str(ZENOH_OVERLAY)}
    out_path = tmp_path / "dora.log"
    with open(out_path, "w", encoding="utf-8") as out:
        proc = subprocess.Popen([_dora(), "run", str(flow)], cwd=tmp_path, env=env, stdout=out,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + 240
            while "loaded in" not in _read(out_path):  # the node's progress log: the voice is ready
                assert proc.poll() is None, tail(_read(out_path))
                assert time.monotonic() < deadline, "the node did not start within 240 s:\n" + tail(_read(out_path))
                time.sleep(0.2)
            time.sleep(2.0)  # the long text streams now (the tiny voice speaks it in many chunks over seconds)
            t0 = time.monotonic()
            os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: dora sends STOP to every node
            rc = proc.wait(timeout=60)
            elapsed = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    output = _read(out_path)
    print(f"{form} form: dora run ended {elapsed:.2f} s after the STOP (rc {rc})")
    assert re.search(r"primespeech: daemon primespeech finished successfully", output), tail(output)
    assert not re.search(r"node_id\S*primespeech|primespeech.*(SIGABRT|exited because of signal)", output), tail(output)
    if form != "nines":  # (the nines are refused before the STOP)
        assert "cancelled: the node is stopping" in output, tail(output)  # the texts in flight were answered
    if form != "operator":
        (after,) = re.findall(r"exiting (\d+\.\d+) s after the STOP", output)
        print(f"{form}: the node exited {after} s after the STOP")
        assert float(after) < 1.0


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
