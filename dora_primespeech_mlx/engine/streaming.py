"""True streaming of one sentence: while the GPT generates, SoVITS decodes overlapping windows of the tokens so
far and :class:`Stitcher` joins them into seamless pieces.

After ``stream_first_tokens`` tokens, then every ``stream_chunk_tokens``, a window starting
``stream_context_tokens`` before the emitted audio is decoded; only the new samples are kept (the last
``stream_lookahead_tokens`` wait for their right context) and each seam is crossfaded over
``stream_crossfade_ms`` (raised cosine). With ``speed_factor`` != 1 every window is interpolated onto one
output-frame grid with the nominal ratio, so each window places the same sound at the same sample (the whole
decode's ``int(2T/speed)+1`` frames differ from that grid by under one frame over a sentence)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..models.sovits import FRAMES_PER_TOKEN, grid_frame, grid_positions, interpolate_at, output_frames
from .config import SynthesisConfig
from .pipeline import Models, NoiseBank, TextChunk


def fade(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Raised-cosine crossfade weights (fade-out, fade-in) that sum to 1 (the two signals are
    near-identical decodes of the same tokens, so an amplitude-preserving fade is right)."""
    t = (np.arange(n, dtype=np.float32) + 0.5) / max(n, 1)
    fade_in = np.sin(0.5 * np.pi * t) ** 2
    return (1.0 - fade_in).astype(np.float32), fade_in.astype(np.float32)


class Stitcher:
    """Joins the overlapping SoVITS window decodes of one streamed sentence into seamless pieces.

    Output frames (50 Hz / speed) lie on one grid for the whole sentence: frame ``i`` interpolates
    the 50 Hz features at source position ``(i + 0.5) * speed - 0.5`` (torch's align_corners=False
    rule with the nominal ratio), so every window places the same sound at the same sample."""

    def __init__(self, hop: int, speed: float, crossfade: int):
        self.hop = hop
        self.speed = speed
        self.crossfade = crossfade
        self.done_tokens = 0  # audio up to this token boundary was emitted (minus `pending`)
        self.pending = np.zeros(0, dtype=np.float32)  # held-back tail of the previous piece

    def frame(self, token: int) -> int:
        """Output frame where token boundary ``token`` falls."""
        return grid_frame(token, self.speed)

    def end_frame(self, n_tokens: int) -> int:
        """Output frames of a whole sentence of ``n_tokens`` (as the whole-sentence decode)."""
        return output_frames(FRAMES_PER_TOKEN * n_tokens, self.speed)

    def piece(self, audio: np.ndarray, start: int, stop: int, final: bool) -> np.ndarray:
        """New audio from a window decode that begins at token ``start``'s frame: everything after
        ``done_tokens`` up to ``stop`` (to the end when ``final``), crossfaded with the held tail;
        the last ``crossfade`` samples are held back for the next piece unless ``final``."""
        a = (self.frame(self.done_tokens) - self.frame(start)) * self.hop
        b = len(audio) if final else (self.frame(stop) - self.frame(start)) * self.hop
        xf = min(len(self.pending), a)
        out = audio[a:b]
        if xf:
            fade_out, fade_in = fade(xf)
            mixed = self.pending[len(self.pending) - xf :] * fade_out + audio[a - xf : a] * fade_in
            out = np.concatenate([self.pending[: len(self.pending) - xf], mixed, out])
        elif len(self.pending):
            out = np.concatenate([self.pending, out])
        if final:
            self.pending = np.zeros(0, dtype=np.float32)
        else:
            keep = min(self.crossfade, len(out))
            self.pending = out[len(out) - keep :].copy()
            out = out[: len(out) - keep]
        self.done_tokens = stop
        return out.astype(np.float32, copy=False)


def next_piece(models: Models, ref, chunk: TextChunk, cfg: SynthesisConfig, stitcher: Stitcher, bank: NoiseBank,
               tokens: list[int], done: bool) -> np.ndarray | None:
    """The next piece of a streamed sentence, or None when there is nothing new to emit yet.

    Decodes tokens[start:] where ``start`` lies ``stream_context_tokens`` before the emitted
    boundary; emits up to ``stream_lookahead_tokens`` before the newest token (all of it when
    ``done``), since the last tokens' audio changes once their right context exists."""
    stop = len(tokens) if done else len(tokens) - cfg.stream_lookahead_tokens
    if not done and stop <= stitcher.done_tokens:
        return None
    if not tokens:
        return np.zeros(0, dtype=np.float32)
    start = max(0, stitcher.done_tokens - cfg.stream_context_tokens)
    window = np.asarray(tokens[start:], dtype=np.int32)
    audio = decode_window(models, ref, window, chunk.phones, cfg.noise_scale, bank, stitcher, start, done)
    return stitcher.piece(audio, start, stop, done)


def decode_window(models: Models, ref, window: np.ndarray, phones: np.ndarray, noise_scale: float, bank: NoiseBank,
                  stitcher: Stitcher, start: int, final: bool) -> np.ndarray:
    """SoVITS decode of the tokens ``window`` (which begin at token ``start``) onto the sentence's
    output-frame grid: frames [frame(start), frame(end)) (to the sentence's end frame when final).
    Same stages as the whole decode; only the speed change uses the fixed grid."""
    sovits = models.sovits
    feats = sovits.encode_features(mx.array(window[None, None]), mx.array(phones[None]), ref.ge)  # (1, C, 2n)
    n = start + len(window)
    f0 = stitcher.frame(start)
    f1 = stitcher.end_frame(n) if final else stitcher.frame(n)
    if stitcher.speed != 1:
        # positions clipped to the window, interpolated in (B, C, T) as before the package split
        feats = interpolate_at(feats, grid_positions(f0, f1, stitcher.speed, start, feats.shape[2]), axis=2)
    _, m_p, logs_p, y_mask = sovits.project(feats, 1.0)
    noise = mx.array(bank.take(f0, m_p.shape[2])) if noise_scale > 0 else None
    z_p = sovits.sample_prior(m_p, logs_p, noise_scale, noise=noise)
    audio = sovits.vocode(sovits.flow_reverse(z_p, y_mask, ref.ge), ref.ge, y_mask)
    return np.array(audio).reshape(-1).astype(np.float32)
