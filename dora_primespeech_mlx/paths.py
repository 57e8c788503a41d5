"""Where the package keeps downloaded and converted files.

This module is imported by every layer (text, models, engine), so it knows nothing but paths.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_MODEL_DIR = "~/.dora/models/primespeech"  # the old node's default: its downloads are reused

# The old node's name first (drop-in use), then the design document's alias.
MODEL_DIR_ENV = ("PRIMESPEECH_MODEL_DIR", "GPTSVITS_MODEL_DIR")


def expand(path: str | os.PathLike) -> Path:
    """Expand ``~`` and ``$VARS`` the way the old node did."""
    return Path(os.path.expandvars(os.path.expanduser(str(path))))


def model_dir() -> Path:
    """The model directory: ``$PRIMESPEECH_MODEL_DIR`` (or ``$GPTSVITS_MODEL_DIR``), else the default.

    The directory is not created here; writers create what they need.
    """
    for name in MODEL_DIR_ENV:
        value = os.environ.get(name, "").strip()
        if value:
            return expand(value)
    return expand(DEFAULT_MODEL_DIR)


def text_data_dir() -> Path:
    """Directory holding the original front end's dictionaries (cmudict.rep, ...).

    ``$PRIMESPEECH_TEXT_DATA`` names an existing folder (tests, offline installs); otherwise
    ``<model_dir>/text-data``, filled on first use.
    """
    value = os.environ.get("PRIMESPEECH_TEXT_DATA", "").strip()
    if value:
        return expand(value)
    return model_dir() / "text-data"


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
