"""Where the package keeps downloaded and converted files.

This module is imported by every layer (text, models, engine), so it knows nothing but paths. The folders inside a
model directory take that directory (``root``) from the caller (the CLI, the node and the engine read the model
directory from the settings and pass it down); the text front end's folders come the same way
(:class:`~dora_primespeech_mlx.text.options.TextData`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from .errors import RequestPathError
from .settings import DEFAULT_MODEL_DIR, expand

__all__ = ["DEFAULT_MODEL_DIR", "expand", "mlx_cache_dir", "originals_dir", "request_path", "request_roots",
           "user_voices_dir"]


def originals_dir(root: Path) -> Path:
    """Original (PyTorch-format) downloads, in the old dora-primespeech layout (``moyoyo/...``)."""
    return Path(root) / "moyoyo"


def mlx_cache_dir(root: Path) -> Path:
    """Converted MLX weights (safetensors + JSON config), one folder per source file."""
    return Path(root) / "mlx"


def user_voices_dir(root: Path) -> Path:
    """User-defined voices: ``<model_dir>/voices/<Name>/voice.yaml``."""
    return Path(root) / "voices"


def request_roots(model: Path, voices: Path | None, setting: tuple[Path, ...] | str | None) -> tuple[Path, ...] | None:
    """The folders whose files per-request voices may read, resolved (``PRIMESPEECH_REQUEST_PATHS``); None: any
    file (the setting ``*``). Unset: the model directory and ``PRIMESPEECH_VOICES_DIR``."""
    if setting == "*":
        return None
    folders: Iterable[Path] = setting if setting is not None else [model, *([voices] if voices else [])]
    return tuple(Path(os.path.realpath(f)) for f in folders)


def request_path(raw: str | os.PathLike, roots: tuple[Path, ...] | None, what: str) -> Path:
    """The file a request names, resolved (symlinks, ``..``; a relative path from the working directory), when it
    is a file inside one of ``roots`` (None: anywhere). The text is taken literally: no ``~`` or ``$VAR``.

    A path outside the folders, a missing one and one that is not a file all raise the same
    :class:`RequestPathError`, naming only the text the request gave, so a request learns nothing about files
    elsewhere (whether they exist, what they hold, what a variable is set to)."""
    text = os.fspath(raw).strip() if isinstance(raw, (str, os.PathLike)) else ""
    shown = text if len(text) <= 120 else text[:117] + "..."
    refused = RequestPathError(f"{what} {shown!r}: not found, or not inside the folders that per-request voices "
                               "may read (PRIMESPEECH_REQUEST_PATHS)")
    if not text or "\0" in text:
        raise refused
    try:
        resolved = Path(os.path.realpath(text))
        allowed = roots is None or any(resolved.is_relative_to(r) for r in roots)
        if not allowed or not resolved.is_file():
            raise refused
    except (OSError, ValueError):
        raise refused from None
    return resolved
