"""The vocoder beside the GPT: on a CPU with two or more threads, ONNX Runtime decodes one sentence's (or one
streamed window's) audio on a worker thread while the caller's thread goes on generating the next tokens.

Only the vocoder moves (ONNX Runtime releases the GIL and touches no MLX state); the text encoder and the flow
stay on the caller's thread (MLX), as does the MLX fallback when ONNX Runtime fails. One worker, first in first
out, so pieces come back in order. ``PRIMESPEECH_OVERLAP``: ``auto`` (default) overlaps when the vocoder runs on
ONNX Runtime with two or more threads — with one thread it would only take turns on the same core — ``1`` whenever
ONNX Runtime runs it, ``0`` never. While the lane works, the GPT's float16 kernels and the BLAS (MLX's matrix
products; the runtime's ``hold_blas``) run on one thread (the engine's ``on_busy``), so they do not fight over the
same cores. A stream hands a window to the lane only while more than :data:`STREAM_QUEUED_S` of the audio it sent is
still to be played (counting from its first chunk, played in real time), or while its earlier windows are still
there (the runtime's ``follow_busy_lane``: its pieces go out in order, so a window vocoded in turn would wait for
them anyway, and beside them it takes longer and holds up the caller): beside the GPT a window is ready later, so the
first audio and any window the listener may soon wait for are vocoded in turn."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

MODES = ("auto", "1", "0")
STREAM_QUEUED_S = 1.5  # a stream's window goes to the lane only while this much sent audio is still unplayed
SEND_BEFORE_NEXT_S = 1.5  # at a sentence's end, while no more than this much sent audio is unplayed, the stream sends
# its pieces still in the lane before the next sentence's start (BERT, prefill), which would slow the lane down


def wanted(mode: str, sovits) -> bool:
    """Whether ``sovits``'s vocoder should run beside the GPT under ``mode``."""
    backend = getattr(sovits, "vocoder_backend", None)
    if mode == "0" or backend is None or backend.active == "mlx":
        return False
    split = getattr(backend, "split", None)
    cores = split.parts if split is not None else int(getattr(backend.generator, "threads", 1))
    if cores == 0:  # ONNX Runtime's default: every core
        cores = os.cpu_count() or 1
    return mode == "1" or cores >= 2


class VocoderLane:
    """One worker thread for ONNX Runtime vocoder runs; :meth:`submit` returns a future of
    ``(audio or None, seconds)`` — None when ONNX Runtime failed and MLX must run it on the caller's thread."""

    def __init__(self, on_busy: Callable[[bool], None] | None = None):
        self._pool: ThreadPoolExecutor | None = None
        self._guard = threading.Lock()
        self._pending = 0
        self.on_busy = on_busy  # called with True when work arrives at an idle lane, False when it is idle again

    def submit(self, backend, z, ge) -> Future:
        z_np, ge_np = np.asarray(z, dtype=np.float32), np.asarray(ge, dtype=np.float32)  # MLX -> numpy here
        with self._guard:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="primespeech-vocoder")
            self._pending += 1
            if self._pending == 1 and self.on_busy is not None:
                self.on_busy(True)
            future = self._pool.submit(_run, backend, z_np, ge_np)
        future.add_done_callback(self._done)
        return future

    def _done(self, _future) -> None:
        with self._guard:
            self._pending -= 1
            if self._pending == 0 and self.on_busy is not None:
                self.on_busy(False)

    def close(self) -> None:
        with self._guard:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def _run(backend, z: np.ndarray, ge: np.ndarray):
    t0 = time.perf_counter()
    audio = backend.run_onnx(z, ge)
    return (None if audio is None else np.asarray(audio, dtype=np.float32).reshape(-1)), time.perf_counter() - t0
