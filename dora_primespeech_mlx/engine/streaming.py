"""True streaming of one sentence: while the GPT generates, SoVITS decodes overlapping windows of the tokens so
far and :class:`Stitcher` joins them into seamless pieces.

When a window is cut is :mod:`.pacing`'s decision (the first after ``stream_first_tokens`` tokens or more,
later ones just in time, at most ``stream_chunk_tokens``). A window starts ``stream_context_tokens`` before the
emitted audio; only the new samples are kept (the last ``stream_lookahead_tokens`` wait for their right context)
and each seam is crossfaded over ``stream_crossfade_ms`` (raised cosine). With ``speed_factor`` != 1 every window
is interpolated onto one output-frame grid with the nominal ratio, so each window places the same sound at the
same sample (the whole decode's ``int(2T/speed)+1`` frames differ from that grid by under one frame over a
sentence)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ..models.sovits.model import FRAMES_PER_TOKEN, grid_frame, grid_positions, interpolate_at, output_frames
from .config import SynthesisConfig
from .pipeline import Models, NoiseBank, TextChunk, vocode


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
        self.planned_tokens = 0  # windows were cut up to here (ahead of done_tokens while the vocoder works)
        self.text_features = None  # the sentence's phone stream through enc_p (computed by the first window)
        self.pending = np.zeros(0, dtype=np.float32)  # held-back tail of the previous piece

    @property
    def crossfade_frames(self) -> int:
        """Output frames the crossfade spans (vocoded again at each seam)."""
        return math.ceil(self.crossfade / self.hop)

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
        self.planned_tokens = max(self.planned_tokens, stop)
        return out.astype(np.float32, copy=False)


@dataclass
class Window:
    """One window's latent, ready for the vocoder: ``z`` holds the window's output frames [lo, hi)
    (relative to the window's first frame, token ``start``); ``frames`` is the window's length. Only the
    emitted span plus the vocoder's margin (:func:`vocoder_margin`) is kept."""

    z: mx.array  # (1, C, hi - lo)
    lo: int
    frames: int
    start: int
    stop: int
    final: bool


def window_latent(models: Models, ref, chunk: TextChunk, cfg: SynthesisConfig, stitcher: Stitcher, bank: NoiseBank,
                  tokens: list[int], done: bool) -> Window | None:
    """The next window of a streamed sentence up to the vocoder, or None when there is nothing new to emit.

    Decodes tokens[start:] where ``start`` lies ``stream_context_tokens`` before the emitted boundary;
    emits up to ``stream_lookahead_tokens`` before the newest token (all of it when ``done``), since the
    last tokens' audio changes once their right context exists. The text encoder and flow see the whole
    window; the vocoder gets the emitted frames and :func:`vocoder_margin` frames on each side (with the whole
    receptive field the same samples as vocoding the whole window)."""
    stop = len(tokens) if done else len(tokens) - cfg.stream_lookahead_tokens
    emit_from = stitcher.planned_tokens  # the previous window's stop, stitched or still in the vocoder
    if not done and stop <= emit_from:
        return None
    start = max(0, emit_from - cfg.stream_context_tokens)
    window = np.asarray(tokens[start:], dtype=np.int32)
    z = window_z(models, ref, window, chunk.phones, cfg.noise_scale, bank, stitcher, start, done)
    frames = z.shape[2]
    f0 = stitcher.frame(start)
    margin = vocoder_margin(models, cfg)
    lo = max(0, stitcher.frame(emit_from) - f0 - stitcher.crossfade_frames - margin)
    hi = frames if done else min(frames, stitcher.frame(stop) - f0 + margin)
    stitcher.planned_tokens = stop
    return Window(z[:, :, lo:hi], lo, frames, start, stop, done)


def vocoder_margin(models: Models, cfg: SynthesisConfig) -> int:
    """Latent frames a window's vocoder run gets beyond the frames it emits: ``stream_vocoder_margin``, at most the
    generator's receptive field (where every frame of the margin still reaches the audio)."""
    return min(models.sovits.dec.receptive_frames, cfg.stream_vocoder_margin)


def place(window: Window, part: np.ndarray, hop: int) -> np.ndarray:
    """The window's audio: the vocoded ``part`` at its frames, zeros where nothing was vocoded (never read)."""
    audio = np.zeros(window.frames * hop, dtype=np.float32)
    part = np.asarray(part, dtype=np.float32).reshape(-1)
    audio[window.lo * hop : window.lo * hop + len(part)] = part
    return audio


class PendingPiece:
    """One streamed piece on its way: a window whose vocoder runs now (``audio``) or in the lane (``future``
    of ``(audio or None, seconds)``), finished in order by :meth:`finish`. ``window`` None: an empty sentence."""

    def __init__(self, stitcher: Stitcher, window: Window | None, audio: np.ndarray | None = None, future=None,
                 latent_s: float = 0.0, vocode_s: float | None = None):
        self.stitcher, self.window, self.audio, self.future = stitcher, window, audio, future
        self.latent_s, self.vocode_s = latent_s, vocode_s  # seconds of window_latent, of the vocoder run here

    def ready(self) -> bool:
        return self.future is None or self.future.done()

    def wait(self) -> None:
        """Until the lane's vocoder run is over (raises its error, if any)."""
        if self.future is not None:
            self.future.result()

    def finish(self, models: Models, ref) -> tuple[np.ndarray, float]:
        """The piece's new audio and the lane's vocoder seconds (waits for the lane). When ONNX Runtime
        failed in the lane, MLX runs the vocoder here, on the caller's thread."""
        w, seconds = self.window, 0.0
        if w is None:
            return np.zeros(0, dtype=np.float32), seconds
        part = self.audio
        if self.future is not None:
            part, seconds = self.future.result()
            if part is None:  # ONNX Runtime failed in the lane
                t0 = time.perf_counter()
                part = vocode(models, ref, w.z)
                seconds += time.perf_counter() - t0
        return self.stitcher.piece(place(w, part, models.hop), w.start, w.stop, w.final), seconds


def next_window(models: Models, ref, chunk: TextChunk, cfg: SynthesisConfig, stitcher: Stitcher, bank: NoiseBank,
                tokens: list[int], done: bool, lane=None) -> PendingPiece | None:
    """The next piece of a streamed sentence as a :class:`PendingPiece` (vocoded now, or handed to ``lane``
    when given), or None when there is nothing new to emit yet."""
    if not tokens:
        return PendingPiece(stitcher, None) if done else None
    t0 = time.perf_counter()
    window = window_latent(models, ref, chunk, cfg, stitcher, bank, tokens, done)
    if window is None:
        return None
    t1 = time.perf_counter()
    if lane is not None:
        return PendingPiece(stitcher, window, future=lane.submit(models.sovits.vocoder_backend, window.z, ref.ge),
                            latent_s=t1 - t0)
    audio = vocode(models, ref, window.z)
    return PendingPiece(stitcher, window, audio=audio, latent_s=t1 - t0, vocode_s=time.perf_counter() - t1)


def window_z(models: Models, ref, window: np.ndarray, phones: np.ndarray, noise_scale: float, bank: NoiseBank,
             stitcher: Stitcher, start: int, final: bool) -> mx.array:
    """SoVITS up to the vocoder for the tokens ``window`` (which begin at token ``start``) on the sentence's
    output-frame grid: frames [frame(start), frame(end)) (to the sentence's end frame when final).
    Same stages as the whole decode; only the speed change uses the fixed grid."""
    sovits = models.sovits
    if stitcher.text_features is None:  # the phone stream is the same for every window of the sentence
        stitcher.text_features = sovits.enc_p.text_features(mx.array(phones[None].astype(np.int32)))
    feats = sovits.encode_features(mx.array(window[None, None]), mx.array(phones[None]), ref.ge,
                                   stitcher.text_features)  # (1, C, 2n)
    n = start + len(window)
    f0 = stitcher.frame(start)
    f1 = stitcher.end_frame(n) if final else stitcher.frame(n)
    if stitcher.speed != 1:
        # positions clipped to the window, interpolated in (B, C, T) as before the package split
        feats = interpolate_at(feats, grid_positions(f0, f1, stitcher.speed, start, feats.shape[2]), axis=2)
    _, m_p, logs_p, y_mask = sovits.project(feats, 1.0)
    noise = mx.array(bank.take(f0, m_p.shape[2])) if noise_scale > 0 else None
    z_p = sovits.sample_prior(m_p, logs_p, noise_scale, noise=noise)
    z = sovits.flow_reverse(z_p, y_mask, ref.ge)
    mx.eval(z)
    return z
