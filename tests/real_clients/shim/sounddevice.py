"""Stand-in for the ``sounddevice`` module: an ``OutputStream`` whose device is a null sink.

The player's own callback is called from a thread at the device's pace (``blocksize`` frames every
``blocksize / samplerate`` seconds, real time), exactly as PortAudio would; what it writes into ``outdata``
is counted by ``_null_sink`` instead of being played. Only what the MoFA players use is provided.
"""

from __future__ import annotations

import threading
import time

import _null_sink
import numpy as np

__version__ = "0.0-null-sink"
default = type("default", (), {"samplerate": None, "device": [None, None], "channels": [1, 1]})()


class CallbackFlags:
    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "CallbackFlags()"


class OutputStream:
    def __init__(self, samplerate=None, blocksize=None, device=None, channels=1, dtype="float32", callback=None,
                 finished_callback=None, **_kw):
        self.samplerate = int(samplerate or 48000)
        self.blocksize = int(blocksize or 1024)
        self.channels = int(channels or 1)
        self.dtype = np.dtype(dtype)
        self._callback = callback
        self._finished = finished_callback
        self._stop = threading.Event()
        self._thread = None
        self.active = False
        self.closed = False
        _null_sink.opened(self.samplerate)

    def _run(self) -> None:
        period = self.blocksize / self.samplerate
        t_next = time.monotonic()
        status = CallbackFlags()
        while not self._stop.is_set():
            out = np.zeros((self.blocksize, self.channels), dtype=self.dtype)
            if self._callback is not None:
                self._callback(out, self.blocksize, None, status)
            _null_sink.record(out[:, 0], self.samplerate)
            t_next += period
            delay = t_next - time.monotonic()
            if delay > 0:
                self._stop.wait(delay)
            else:
                t_next = time.monotonic()  # fell behind (loaded machine): no burst to catch up

    def start(self) -> None:
        if self.active:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="null-output-stream", daemon=True)
        self._thread.start()
        self.active = True

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
        self.active = False
        _null_sink.flush()

    abort = stop

    def close(self) -> None:
        self.stop()
        self.closed = True
        if self._finished is not None:
            self._finished()

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.close()


def query_devices(*_a, **_kw):
    return [{"name": "null sink", "max_output_channels": 2, "max_input_channels": 0,
             "default_samplerate": 48000.0}]


def sleep(msec: int) -> None:
    time.sleep(msec / 1000.0)
