"""The null output device behind the ``sounddevice`` and ``pyaudio`` stand-ins.

It keeps what a real device would have played: every sample the player hands over is counted (``frames``)
and the non-zero ones (``voiced``: samples that carry sound) are counted apart, so silence that a player
writes while its buffer is empty or paused is not taken for speech. The totals go as JSON to
``$NULL_SINK_REPORT`` twice a second and at exit, with the time of the last non-zero sample (the check's
drivers read it to wait until an answer has been played).
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time

import numpy as np

_lock = threading.Lock()
_state = {"frames": 0, "voiced": 0, "voiced_seconds": 0.0, "streams": 0, "rates": [], "last_voiced": 0.0,
          "first_voiced": 0.0, "writes": 0, "updated": 0.0}
_path = os.environ.get("NULL_SINK_REPORT", "")


def record(samples: np.ndarray, rate: int) -> None:
    """Count one block the player sent to the device (mono or interleaved; any dtype)."""
    flat = np.asarray(samples).reshape(-1)
    voiced = int(np.count_nonzero(flat))
    now = time.time()
    with _lock:
        _state["frames"] += int(flat.size)
        _state["voiced"] += voiced
        _state["voiced_seconds"] += voiced / float(rate)
        _state["writes"] += 1
        if voiced:
            _state["last_voiced"] = now
            _state["first_voiced"] = _state["first_voiced"] or now


def opened(rate: int) -> None:
    with _lock:
        _state["streams"] += 1
        _state["rates"].append(int(rate))


def flush() -> None:
    if not _path:
        return
    with _lock:  # one writer at a time (the flusher thread, stream stop, exit)
        _state["updated"] = time.time()
        tmp = f"{_path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps(_state))
        os.replace(tmp, _path)


def _flusher() -> None:
    while True:
        time.sleep(0.5)
        try:
            flush()
        except OSError:
            pass


threading.Thread(target=_flusher, name="null-sink-report", daemon=True).start()
atexit.register(flush)
