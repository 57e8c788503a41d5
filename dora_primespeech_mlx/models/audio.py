"""Audio helpers around the models: reading, resampling and the SoVITS reference spectrogram
(gpt-sovits-v2.md sections 4.1 and 6.2). numpy only."""

from __future__ import annotations

import os

import numpy as np


def load_wav(path: str | os.PathLike) -> tuple[np.ndarray, int]:
    """Read an audio file with soundfile -> (float32 mono waveform, sample rate).

    Integer PCM is scaled to [-1, 1) (int16 / 32768, as torchaudio and librosa do); several channels
    are averaged.
    """
    import soundfile as sf

    try:
        data, sr = sf.read(str(path), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, OSError) as e:
        raise ValueError(f"cannot read audio file {os.fspath(path)!r}: {e}") from e
    if data.shape[0] == 0:
        raise ValueError(f"audio file {os.fspath(path)!r} holds no samples")
    mono = data[:, 0] if data.shape[1] == 1 else data.mean(axis=1)
    return np.ascontiguousarray(mono, dtype=np.float32), int(sr)


def mono_clip(wav, what: str = "HuBERT features") -> np.ndarray:
    """A mono 1-D float32 waveform from (N,) or (1, N); ValueError naming ``what`` otherwise."""
    wav = np.asarray(wav, dtype=np.float32)
    if wav.ndim == 2 and wav.shape[0] == 1:
        wav = wav[0]
    if wav.ndim != 1:
        raise ValueError(f"{what} expect a mono 1-D 16 kHz waveform, got shape {wav.shape}")
    return wav


def resample(x: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    """Resample a mono waveform with soxr 'HQ' (librosa's ``res_type="soxr_hq"``, its default), the output
    length fixed to ``ceil(len * sr_out / sr_in)`` like ``librosa.resample``."""
    x = np.asarray(x, dtype=np.float32)
    if sr_in == sr_out:
        return x.copy()
    import soxr

    y = soxr.resample(x, sr_in, sr_out, quality="HQ")
    n = int(np.ceil(x.shape[-1] * sr_out / sr_in))
    if y.shape[-1] > n:
        y = y[:n]
    elif y.shape[-1] < n:
        y = np.pad(y, (0, n - y.shape[-1]))
    return np.ascontiguousarray(y, dtype=np.float32)


def hann_window(n: int) -> np.ndarray:
    """Periodic Hann window (``torch.hann_window(n)``)."""
    return (0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n) / n)).astype(np.float64)


def spectrogram(
    wav: np.ndarray,
    n_fft: int = 2048,
    hop_length: int = 640,
    win_length: int = 2048,
) -> np.ndarray:
    """``spectrogram_torch(center=False)``: reflect-pad (n_fft - hop) / 2 on both sides, STFT with a
    periodic Hann window, magnitude ``sqrt(re^2 + im^2 + 1e-8)``. wav (N,) or (1, N) -> (1, n_fft//2+1, F)
    float32 (linear magnitude: no log, no mel)."""
    x = np.asarray(wav, dtype=np.float64)
    if x.ndim == 2 and x.shape[0] == 1:
        x = x[0]
    if x.ndim != 1:
        raise ValueError(f"spectrogram expects a mono waveform, got shape {np.shape(wav)}")
    pad = (n_fft - hop_length) // 2
    if x.shape[0] <= pad:
        raise ValueError(f"waveform of {x.shape[0]} samples is too short for a reflect pad of {pad}")
    x = np.pad(x, (pad, pad), mode="reflect")
    if x.shape[0] < n_fft:
        raise ValueError(f"waveform of {len(wav)} samples is too short for one {n_fft}-point frame")
    window = hann_window(win_length)
    if win_length < n_fft:  # torch centres a shorter window inside the frame
        left = (n_fft - win_length) // 2
        window = np.pad(window, (left, n_fft - win_length - left))
    n_frames = (x.shape[0] - n_fft) // hop_length + 1
    frames = np.lib.stride_tricks.sliding_window_view(x, n_fft)[::hop_length][:n_frames]
    spec = np.fft.rfft(frames * window, axis=-1)
    mag = np.sqrt(spec.real**2 + spec.imag**2 + 1e-8)
    return mag.T[None].astype(np.float32)
