"""The speaker-verification model's audio front end, numpy only (torch-free):

- :func:`resample_sinc`: ``torchaudio.transforms.Resample`` with its defaults (``sinc_interp_hann``,
  lowpass_filter_width 6, rolloff 0.99), which upstream ``TTS._get_ref_spec`` uses to bring the 32 kHz
  reference to 16 kHz for v2Pro voices;
- :func:`kaldi_fbank`: Kaldi log-mel filterbank features as ``eres2net/kaldi.py fbank`` computes them with
  the arguments of ``sv.py`` (80 bins, 16 kHz, no dither, everything else at its default).

Both compute in float64 and return float32 (the original runs in float32; the differences are far below
the features' tolerance).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

SV_SAMPLE_RATE = 16000
FLOAT32_EPS = float(np.finfo(np.float32).eps)  # kaldi.py's EPSILON: floor of every filterbank energy


# ---------------------------------------------------------------------------------------------------------
# torchaudio's sinc resampling


@lru_cache(maxsize=8)
def _sinc_kernel(orig: int, new: int, lowpass_filter_width: int, rolloff: float) -> tuple[np.ndarray, int]:
    """(kernels (new, 2 * width + orig), width) of torchaudio's ``_get_sinc_resample_kernel`` (Hann
    window), computed in float64 and rounded to float32 as torchaudio stores it for float32 audio."""
    base_freq = min(orig, new) * rolloff
    width = math.ceil(lowpass_filter_width * orig / base_freq)
    idx = np.arange(-width, width + orig, dtype=np.float64)[None, :] / orig
    t = np.arange(0, -new, -1, dtype=np.float64)[:, None] / new + idx
    t = np.clip(t * base_freq, -lowpass_filter_width, lowpass_filter_width)
    window = np.cos(t * math.pi / lowpass_filter_width / 2) ** 2
    t = t * math.pi
    with np.errstate(invalid="ignore", divide="ignore"):
        sinc = np.where(t == 0, 1.0, np.sin(t) / np.where(t == 0, 1.0, t))
    kernels = sinc * window * (base_freq / orig)
    return kernels.astype(np.float32), width


def resample_sinc(
    wav: np.ndarray, orig_freq: int, new_freq: int, lowpass_filter_width: int = 6, rolloff: float = 0.99
) -> np.ndarray:
    """``torchaudio.functional.resample`` (default ``sinc_interp_hann``) of a mono waveform (N,) ->
    (ceil(N * new / orig),) float32: zero-pad ``width`` left and ``width + orig`` right, correlate each
    output phase's kernel with stride ``orig``, interleave the phases, cut to the target length."""
    x = np.asarray(wav, dtype=np.float32).reshape(-1)
    if orig_freq == new_freq:
        return x.copy()
    g = math.gcd(int(orig_freq), int(new_freq))
    orig, new = int(orig_freq) // g, int(new_freq) // g
    kernels, width = _sinc_kernel(orig, new, int(lowpass_filter_width), float(rolloff))
    length = x.shape[0]
    padded = np.pad(x.astype(np.float64), (width, width + orig))
    taps = kernels.shape[1]
    n_out = (padded.shape[0] - taps) // orig + 1
    frames = np.lib.stride_tricks.sliding_window_view(padded, taps)[::orig][:n_out]  # (n_out, taps)
    out = frames @ kernels.astype(np.float64).T  # (n_out, new): phase j of input block i
    target = math.ceil(new * length / orig)
    return np.ascontiguousarray(out.reshape(-1)[:target], dtype=np.float32)


# ---------------------------------------------------------------------------------------------------------
# Kaldi fbank


@lru_cache(maxsize=8)
def mel_banks(num_bins: int, padded_window: int, sample_rate: float, low_freq: float, high_freq: float) -> np.ndarray:
    """Kaldi's triangular mel filters (no VTLN) on the FFT bins: (num_bins, padded_window // 2 + 1),
    the Nyquist column zero (kaldi.py ``get_mel_banks`` + its right zero pad).

    Computed in float32 step by step as kaldi.py does (its tensors are float32 whatever the audio's dtype):
    the low mel bins span one or two FFT bins, so the float32 rounding of the filter edges moves their
    log energies by up to ~3e-4, which the speaker-verification network amplifies ten-fold; float64
    filters would be "more exact" but further from the original."""
    f32 = np.float32
    nyquist = 0.5 * sample_rate
    if high_freq <= 0.0:
        high_freq += nyquist
    if not (0.0 <= low_freq < nyquist and 0.0 < high_freq <= nyquist and low_freq < high_freq):
        raise ValueError(f"bad mel range {low_freq}..{high_freq} Hz for a sample rate of {sample_rate}")
    n_fft_bins = padded_window // 2
    fft_bin_width = sample_rate / padded_window
    mel_low = 1127.0 * math.log(1.0 + low_freq / 700.0)  # python floats, as in kaldi.py
    mel_high = 1127.0 * math.log(1.0 + high_freq / 700.0)
    delta = (mel_high - mel_low) / (num_bins + 1)
    b = np.arange(num_bins, dtype=f32)[:, None]
    left = f32(mel_low) + b * f32(delta)
    center = f32(mel_low) + (b + f32(1.0)) * f32(delta)
    right = f32(mel_low) + (b + f32(2.0)) * f32(delta)
    freq = f32(fft_bin_width) * np.arange(n_fft_bins, dtype=f32)
    mel = (f32(1127.0) * np.log(f32(1.0) + freq / f32(700.0)))[None, :]
    up = (mel - left) / (center - left)
    down = (right - mel) / (right - center)
    banks = np.maximum(f32(0.0), np.minimum(up, down))
    return np.pad(banks, ((0, 0), (0, 1))).astype(np.float64)


def povey_window(n: int) -> np.ndarray:
    """Kaldi's "povey" window: the symmetric Hann window to the power 0.85."""
    return (0.5 - 0.5 * np.cos(2.0 * math.pi * np.arange(n) / (n - 1))) ** 0.85


def kaldi_fbank(
    wav: np.ndarray,
    num_mel_bins: int = 80,
    sample_frequency: float = SV_SAMPLE_RATE,
    frame_length_ms: float = 25.0,
    frame_shift_ms: float = 10.0,
    preemphasis: float = 0.97,
    low_freq: float = 20.0,
    high_freq: float = 0.0,
) -> np.ndarray:
    """Log-mel filterbank of a mono waveform (N,) in [-1, 1] -> (T, num_mel_bins) float32,
    T = 1 + (N - window) // shift (``snip_edges``). Per frame: remove the mean, pre-emphasis
    ``x[i] - 0.97 x[i-1]`` (``x[-1] = x[0]``), povey window, zero-pad to a power of two, power
    spectrum, mel filters, ``log(max(energy, float32 eps))``. No dither, no energy column."""
    x = np.asarray(wav, dtype=np.float64).reshape(-1)
    shift = int(sample_frequency * frame_shift_ms * 0.001)
    size = int(sample_frequency * frame_length_ms * 0.001)
    padded = 1 << (size - 1).bit_length()
    if x.shape[0] < size:
        raise ValueError(
            f"waveform of {x.shape[0]} samples is shorter than one {frame_length_ms:g} ms fbank frame ({size})"
        )
    n_frames = 1 + (x.shape[0] - size) // shift
    frames = np.lib.stride_tricks.sliding_window_view(x, size)[::shift][:n_frames]
    frames = frames - frames.mean(axis=1, keepdims=True)
    if preemphasis:
        prev = np.concatenate([frames[:, :1], frames[:, :-1]], axis=1)
        frames = frames - preemphasis * prev
    frames = frames * povey_window(size)[None, :]
    spectrum = np.abs(np.fft.rfft(frames, n=padded, axis=1)) ** 2  # (T, padded // 2 + 1)
    energies = spectrum @ mel_banks(num_mel_bins, padded, float(sample_frequency), low_freq, high_freq).T
    return np.log(np.maximum(energies, FLOAT32_EPS)).astype(np.float32)
