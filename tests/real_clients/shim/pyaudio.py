"""Stand-in for the ``pyaudio`` module: ``PyAudio().open(output=True)`` gives a stream whose device is a null
sink. ``Stream.write`` blocks for the time the samples take to play (real time), as a blocking PortAudio
write does, and ``_null_sink`` counts them. Only what dora-hub's dora-pyaudio uses is provided.
"""

from __future__ import annotations

import time

import _null_sink
import numpy as np

paFloat32, paInt32, paInt24, paInt16, paInt8, paUInt8 = 1, 2, 4, 8, 16, 32
_DTYPES = {paFloat32: np.float32, paInt32: np.int32, paInt16: np.int16, paInt8: np.int8, paUInt8: np.uint8}
__version__ = "0.0-null-sink"


def get_sample_size(fmt: int) -> int:
    return {paInt24: 3}.get(fmt, np.dtype(_DTYPES.get(fmt, np.int16)).itemsize)


class Stream:
    def __init__(self, rate, channels=1, format=paInt16, output=False, input=False, **_kw):  # noqa: A002
        if not output:
            raise OSError("the null sink only plays (output=True)")
        self.rate, self.channels, self.dtype = int(rate), int(channels), _DTYPES.get(format, np.int16)
        self._active = True
        _null_sink.opened(self.rate)

    def write(self, frames, num_frames=None, exception_on_underflow=False) -> None:
        samples = np.frombuffer(bytes(frames), dtype=self.dtype)
        _null_sink.record(samples[:: self.channels], self.rate)
        time.sleep(len(samples) / self.channels / self.rate)

    def is_active(self) -> bool:
        return self._active

    def start_stream(self) -> None:
        self._active = True

    def stop_stream(self) -> None:
        self._active = False
        _null_sink.flush()

    def close(self) -> None:
        self.stop_stream()


class PyAudio:
    def open(self, *args, **kw) -> Stream:
        return Stream(*args, **kw)

    def get_sample_size(self, fmt: int) -> int:
        return get_sample_size(fmt)

    def get_device_count(self) -> int:
        return 1

    def terminate(self) -> None:
        _null_sink.flush()
