"""Audio helpers around the models: reading, resampling and the SoVITS reference spectrogram
(docs/model.md, "Reference features"). numpy only.

Reading is bounded (docs/security.md): only a regular file, checked from its header (length, channels, sample
rate) before anything is decoded, decoded at most to the frames the limits allow, within a time limit, and
refused when its samples are not finite or lie far above full scale.
"""

from __future__ import annotations

import os
import stat
import threading

import numpy as np

MAX_SECONDS = 30.0  # hard limit on a clip's length (the reference itself must be 3-10 s)
MAX_CHANNELS = 8
MIN_RATE, MAX_RATE = 8000, 192000  # Hz
MAX_PEAK = 100.0  # 40 dB over full scale: a float file louder than this holds no usable audio
READ_TIMEOUT_SECONDS = 10.0  # a read that stalls longer (a hung network or device file) is given up


class ClipTooLongError(ValueError):
    """A clip over the length limit, found from its header (or from the frames read when the header understates
    them); ``seconds`` is the header's length (the limit plus a frame when the header understated it)."""

    def __init__(self, message: str, seconds: float):
        super().__init__(message)
        self.seconds = seconds


def load_wav(path: str | os.PathLike, max_seconds: float = MAX_SECONDS,
             timeout: float = READ_TIMEOUT_SECONDS) -> tuple[np.ndarray, int]:
    """Read an audio file with soundfile -> (float32 mono waveform, sample rate).

    Integer PCM is scaled to [-1, 1) (int16 / 32768, as torchaudio and librosa do); several channels
    are averaged. ValueError, naming the limit, for anything but a regular file, a header over the limits
    (``max_seconds``, :data:`MAX_CHANNELS`, :data:`MIN_RATE`..:data:`MAX_RATE`), a read slower than ``timeout``
    seconds, or samples that are not finite or above :data:`MAX_PEAK`.
    """
    name = os.fspath(path)
    result: dict = {}

    def work() -> None:
        try:
            result["value"] = _read_checked(name, max_seconds)
        except BaseException as exc:  # handed to the caller's thread
            result["error"] = exc

    worker = threading.Thread(target=work, name="audio-read", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():  # left to finish or block on its own (daemon thread): the caller is answered now
        raise ValueError(f"cannot read audio file {name!r}: no answer within {timeout:g} s (READ_TIMEOUT_SECONDS)")
    if "error" in result:
        raise result["error"]
    return result["value"]


def _read_checked(name: str, max_seconds: float) -> tuple[np.ndarray, int]:
    import soundfile as sf

    try:
        if not stat.S_ISREG(os.stat(name).st_mode):  # a FIFO or device would block or never end
            raise ValueError(f"audio file {name!r} is not a regular file")
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as raw:
            if not stat.S_ISREG(os.fstat(raw.fileno()).st_mode):  # swapped since the stat
                raise ValueError(f"audio file {name!r} is not a regular file")
            with sf.SoundFile(raw) as f:
                max_frames = _check_header(name, f.frames, f.samplerate, f.channels, f.format, max_seconds)
                data = f.read(frames=max_frames + 1, dtype="float32", always_2d=True)
                sr = int(f.samplerate)
    except (sf.LibsndfileError, RuntimeError, OSError) as e:
        raise ValueError(f"cannot read audio file {name!r}: {e}") from e
    if data.shape[0] > max_frames:  # the header understated the length
        raise ClipTooLongError(f"audio file {name!r} is longer than {max_seconds:g} s, the limit",
                               data.shape[0] / sr)
    if data.shape[0] == 0:
        raise ValueError(f"audio file {name!r} holds no samples")
    mono = data[:, 0] if data.shape[1] == 1 else data.mean(axis=1)
    _check_samples(name, mono)
    return np.ascontiguousarray(mono, dtype=np.float32), sr


def _check_header(name: str, frames: int, rate: int, channels: int, fmt: str, max_seconds: float) -> int:
    """The most frames a clip of ``rate`` may have; ValueError naming the limit a header breaks."""
    if not MIN_RATE <= rate <= MAX_RATE:
        raise ValueError(f"audio file {name!r} has a sample rate of {rate} Hz; the limits are "
                         f"{MIN_RATE}-{MAX_RATE} Hz (MIN_RATE, MAX_RATE)")
    if not 1 <= channels <= MAX_CHANNELS:
        raise ValueError(f"audio file {name!r} ({fmt}) has {channels} channels; the limit is {MAX_CHANNELS} "
                         "(MAX_CHANNELS)")
    max_frames = int(max_seconds * rate)
    if frames > max_frames:
        raise ClipTooLongError(f"audio file {name!r} lasts {frames / rate:.1f} s; the limit is {max_seconds:g} s",
                               frames / rate)
    return max_frames


def _check_samples(name: str, mono: np.ndarray) -> None:
    """Refuse NaN or infinite samples and a peak over :data:`MAX_PEAK` (a float file's samples are unbounded;
    such values turn every synthesis into NaN)."""
    if not np.isfinite(mono).all():
        raise ValueError(f"audio file {name!r} has NaN or infinite samples")
    peak = float(np.abs(mono).max())
    if peak > MAX_PEAK:
        raise ValueError(f"audio file {name!r} peaks at {peak:.3g}, over the limit of {MAX_PEAK:g} times full "
                         "scale (MAX_PEAK)")


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
