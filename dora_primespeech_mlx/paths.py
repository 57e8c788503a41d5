"""Where the package keeps downloaded and converted files.

This module is imported by every layer (text, models, engine), so it knows nothing but paths; the
directories named by environment variables come from :mod:`.settings`, where they are declared.
"""

from __future__ import annotations

from pathlib import Path

from .settings import DEFAULT_MODEL_DIR, expand, read

__all__ = ["DEFAULT_MODEL_DIR", "expand", "mlx_cache_dir", "model_dir", "nltk_data_dir", "originals_dir",
           "text_data_dir", "user_voices_dir"]


def model_dir() -> Path:
    """The model directory: ``$PRIMESPEECH_MODEL_DIR`` (or ``$GPTSVITS_MODEL_DIR``), else the default.

    The directory is not created here; writers create what they need.
    """
    return read("model_dir")


def text_data_dir() -> Path:
    """Directory holding the original front end's dictionaries (cmudict.rep, ...).

    ``$PRIMESPEECH_TEXT_DATA`` names an existing folder (tests, offline installs); otherwise
    ``<model_dir>/text-data``, filled on first use.
    """
    return read("text_data") or model_dir() / "text-data"


def nltk_data_dir() -> Path:
    """Where the package downloads NLTK data when none is found on NLTK's own search path."""
    return model_dir() / "nltk_data"


def originals_dir(root: Path | None = None) -> Path:
    """Original (PyTorch-format) downloads, in the old dora-primespeech layout (``moyoyo/...``)."""
    return (root or model_dir()) / "moyoyo"


def mlx_cache_dir(root: Path | None = None) -> Path:
    """Converted MLX weights (safetensors + JSON config), one folder per source file."""
    return (root or model_dir()) / "mlx"


def user_voices_dir(root: Path | None = None) -> Path:
    """User-defined voices: ``<model_dir>/voices/<Name>/voice.yaml``."""
    return (root or model_dir()) / "voices"
