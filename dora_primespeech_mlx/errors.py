"""Error types shared by the engine, the node and the command line.

The text front end has its own (``dora_primespeech_mlx.text.errors``) and checkpoint reading raises
``dora_primespeech_mlx.convert.torch_pickle.CheckpointError``.
"""

from __future__ import annotations


class PrimeSpeechError(Exception):
    """Base class of this package's runtime errors."""


class ConfigError(PrimeSpeechError, ValueError):
    """An invalid setting (environment variable, request parameter, voice file)."""


class VoiceNotFoundError(PrimeSpeechError, LookupError):
    """No voice of that name exists (neither a preset nor a user-defined voice)."""


class VoiceNotInstalledError(PrimeSpeechError, FileNotFoundError):
    """The voice is known but its files are not on this machine (download or point to them)."""


class RequestPathError(VoiceNotInstalledError):
    """A path in a request (``VOICE:CUSTOM`` / ``VOICE:TRAINED``) names no file inside the folders such requests may
    read. One message for "missing" and "not allowed", so a request cannot probe what exists elsewhere."""


class DownloadError(PrimeSpeechError):
    """A download failed (offline, missing file upstream, checksum mismatch)."""


class NothingToSpeakError(PrimeSpeechError, ValueError):
    """The text has nothing speakable (empty, punctuation or symbols only). ``language``: the language it was read
    as when it has letters that language cannot read (e.g. Chinese read as ``en``); None when it has none."""

    def __init__(self, message: str, language: str | None = None):
        super().__init__(message)
        self.language = language


class SynthesisError(PrimeSpeechError, RuntimeError):
    """A model stage failed while synthesising; ``stage`` names it (text, bert, gpt, sovits, ...)."""

    def __init__(self, message: str, stage: str = "synthesis"):
        super().__init__(message)
        self.stage = stage


class SynthesisCancelled(PrimeSpeechError):
    """A synthesis was cancelled through its ``cancel`` event (e.g. the node's ``reset``)."""
