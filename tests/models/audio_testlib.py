"""Upstream's int16 output rule (gpt-sovits-v2.md section 8.6), which the tests compare with the golden
``output_int16``. The product outputs float32 (the engine's ``audio_postprocess`` steps without the int16
conversion), so this lives with the tests."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def to_int16_output(fragments: Iterable[np.ndarray], sr: int, fragment_interval: float = 0.3) -> np.ndarray:
    """The pipeline's output (``TTS.audio_postprocess``): each fragment divided by its peak if that
    exceeds 1, followed by ``int(sr * fragment_interval)`` zeros (after every fragment, the last too),
    concatenated and converted with ``(x * 32768).astype(int16)``: no clipping, as in the original."""
    gap = np.zeros(int(sr * fragment_interval), dtype=np.float32)
    parts = []
    for frag in fragments:
        x = np.asarray(frag, dtype=np.float32).reshape(-1)
        peak = float(np.max(np.abs(x))) if x.size else 0.0
        if peak > 1:
            x = x / peak
        parts.extend([x, gap])
    if not parts:
        return np.zeros(0, dtype=np.int16)
    return (np.concatenate(parts) * 32768).astype(np.int16)
