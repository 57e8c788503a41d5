"""The vocoder over several cores by splitting time: the generator is a stack of convolutions, so a stretch of the
latent with :attr:`Generator.receptive_frames` extra frames on each side vocodes to exactly the samples of that
stretch in the whole (bit-identical on ONNX Runtime, measured). Which session runs a latent depends only on its
length, so a request's audio does not depend on timing. ``parts`` stretches run at once, each on its own thread with
a single-threaded ONNX Runtime session (one session; ``run`` is thread-safe), so the cores never wait on each other
inside a layer — ONNX Runtime's own intra-op threads synchronise at every one of the generator's ~100 convolutions.
A latent too short for every part to be :data:`MIN_FRAMES_PER_MARGIN` margins long runs whole on ``whole`` (the
session with ``parts`` intra-op threads), never on fewer cores.

Where cutting pays: ``python tests/tools/vocoder_cut_sweep.py`` times two parts against one run with two intra-op
threads per latent length (docs/performance.md, "The vocoder cut in two at two threads"); on the 2-core AVX2 EPYC
cutting wins from about 6 margins of latent, hence parts of at least 4 margins."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

MIN_FRAMES_PER_MARGIN = 4  # cut only when every part is >= this many margins long (else the whole run is faster)


class SplitRunner:
    """Runs ``fn(z, ge) -> audio`` (numpy, (B, C, T) -> (B, 1, T * hop)) over ``parts`` time stretches at once.
    ``whole``: what runs a latent too short to be cut into ``parts`` (the several-thread session); without it such
    a latent is cut into fewer parts, or runs on ``fn`` alone."""

    def __init__(self, fn: Callable[[np.ndarray, np.ndarray], np.ndarray], parts: int, margin: int, hop: int,
                 whole: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
                 cores: Callable[[], int] | None = None):
        self.fn, self.parts, self.margin, self.hop = fn, max(1, int(parts)), int(margin), int(hop)
        self.whole = whole
        self.cores = cores  # () -> the cores free now (an engine's thread plan); fewer than parts: ``fn`` alone
        self._pool = ThreadPoolExecutor(self.parts - 1, thread_name_prefix="primespeech-vocoder-part") \
            if self.parts > 1 else None

    def parts_for(self, frames: int) -> int:
        return max(1, min(self.parts, frames // max(1, MIN_FRAMES_PER_MARGIN * self.margin)))

    def __call__(self, z: np.ndarray, ge: np.ndarray) -> np.ndarray:
        frames = z.shape[2]
        if self.cores is not None and self.cores() < self.parts:  # the plan has fewer cores now: one thread, whole
            return self.fn(z, ge)
        n = self.parts_for(frames)
        if n < self.parts and self.whole is not None:
            return self.whole(z, ge)
        if n == 1 or self._pool is None:
            return self.fn(z, ge)
        bounds = np.linspace(0, frames, n + 1).round().astype(int)

        def part(i: int) -> np.ndarray:
            a, b = int(bounds[i]), int(bounds[i + 1])
            lo, hi = max(0, a - self.margin), min(frames, b + self.margin)
            audio = self.fn(np.ascontiguousarray(z[:, :, lo:hi]), ge)
            return audio[..., (a - lo) * self.hop : (b - lo) * self.hop]

        others = [self._pool.submit(part, i) for i in range(1, n)]
        first = part(0)  # this thread takes a part too
        return np.concatenate([first, *(f.result() for f in others)], axis=-1)

    def describe(self) -> dict:
        return {"parts": self.parts, "margin_frames": self.margin,
                "whole_below_frames": self.parts * MIN_FRAMES_PER_MARGIN * self.margin if self.whole else None}
