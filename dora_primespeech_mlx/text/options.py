"""Where the text front end finds its data, as one value the entry points build and pass down.

:class:`TextData` names the folder of the original front end's dictionaries, the folder NLTK data is
downloaded into when NLTK's own search path lacks it, the g2pW choice, and where prepared forms of the
dictionaries are kept (PRIMESPEECH_CACHE_DIR/text). The CLI, the node (through the
engine) and the benchmark build it from their :class:`~dora_primespeech_mlx.settings.Settings`; nothing in
the front end reads the environment. It is frozen (hashable), so the loaders cache per folder and two
engines with different folders never share a wrong cache.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from .g2pw import G2PWOptions, g2pw_dir


class TextSettings(Protocol):
    """The settings :meth:`TextData.from_settings` reads (a :class:`~dora_primespeech_mlx.settings.Settings`; the
    text layer does not import the settings module)."""

    model_dir: Path
    text_data: Path | None
    g2pw: bool
    g2pw_vocab: Path | None
    cache_dir: Path


@dataclass(frozen=True)
class TextData:
    """The text front end's folders and its g2pW choice (see the module docstring)."""

    folder: Path  # the original front end's dictionaries (cmudict.rep, ...; filled on first use when missing)
    nltk_folder: Path  # NLTK data downloaded here when NLTK's own search path lacks it
    g2pw: G2PWOptions = field(default_factory=G2PWOptions)  # off: pypinyin
    cache: Path | None = None  # prepared forms of the dictionaries (written on first use); None: parsed each time

    @classmethod
    def from_settings(cls, settings: TextSettings, model_dir: str | os.PathLike | None = None) -> TextData:
        """The front end's data for ``settings``: ``PRIMESPEECH_TEXT_DATA`` or ``<model_dir>/text-data``, NLTK
        downloads in ``<model_dir>/nltk_data``, g2pW (``PRIMESPEECH_G2PW``, ``PRIMESPEECH_G2PW_VOCAB``) from
        ``<model_dir>/G2PWModel``. ``model_dir`` (default: the settings') is the engine's when it overrides them."""
        root = Path(model_dir).expanduser() if model_dir is not None else Path(settings.model_dir)
        vocab = None if settings.g2pw_vocab is None else os.fspath(settings.g2pw_vocab)
        return cls(
            folder=Path(settings.text_data) if settings.text_data else root / "text-data",
            nltk_folder=root / "nltk_data",
            g2pw=G2PWOptions(bool(settings.g2pw), vocab, os.fspath(g2pw_dir(root))),
            cache=Path(settings.cache_dir) / "text",
        )


__all__ = ["G2PWOptions", "TextData", "TextSettings"]
