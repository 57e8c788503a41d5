"""The checks ``primespeech-mlx say`` makes before it loads any model: the text has something to speak, every
option is in its range, the output file can be written, the voice exists and is installed. Each needs no engine
and no MLX, so a mistake is answered at once instead of after seconds of loading. The ranges are the engine's own
(:data:`..defaults.RANGES`), so what passes here is never refused later for the same reason."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from . import defaults
from .errors import ConfigError, NothingToSpeakError

# synthesis setting -> the option of `say` that sets it
OPTIONS = {"top_k": "--top-k", "top_p": "--top-p", "temperature": "--temperature",
           "repetition_penalty": "--repetition-penalty", "speed_factor": "--speed", "seed": "--seed",
           "text_split_method": "--split", "fragment_interval": "--fragment-interval", "text_lang": "--lang"}


def check_text(text: str, lang: str | None, llm_text: bool) -> str:
    """What is spoken of ``text``: the LLM text stage's output when ``llm_text`` is on (``PRIMESPEECH_LLM_TEXT``,
    read by the CLI: reasoning, tool calls and code are not spoken), else ``text``; NothingToSpeakError when that
    has no letter or digit."""
    from .text.llm import clean
    from .text.speakable import has_speakable

    spoken = clean(text, lang) if llm_text else text
    if not has_speakable(spoken):
        raise NothingToSpeakError(f"nothing to speak in {text[:80]!r} (no letters or digits)")
    return spoken


def check_options(overrides: dict) -> None:
    """ConfigError naming the option of the first value out of its range (or an unknown language / split)."""
    from .text.language_segments import check_option

    for name, value in overrides.items():
        option = OPTIONS.get(name, name)
        if name == "text_lang":
            check_option(value)
        elif name == "text_split_method":
            if value not in defaults.TEXT_SPLIT_METHODS:
                raise ConfigError(f"{option} {value}: must be one of {', '.join(defaults.TEXT_SPLIT_METHODS)}")
        elif name in defaults.RANGES:
            rng = defaults.RANGES[name]
            if not rng.contains(value) or value != value:  # NaN compares false everywhere
                raise ConfigError(f"{option} {value}: {rng.describe()}")


def check_output(path: Path) -> None:
    """ConfigError when ``path`` cannot become a 16-bit audio file: a folder, a format soundfile cannot write that
    way, a missing folder, or one where no file can be created (tried with a temporary file)."""
    import soundfile as sf

    if path.is_dir():
        raise ConfigError(f"--output {path} is a folder; give a file name such as {path / 'out.wav'}")
    kind = path.suffix.lstrip(".").upper()
    if kind not in sf.available_formats() or not sf.check_format(kind, "PCM_16"):
        raise ConfigError(f"--output {path}: cannot write 16-bit audio as {path.suffix or 'a name without a suffix'}"
                          "; use a .wav (or .flac) file name")
    folder = path.parent
    if not folder.is_dir():
        raise ConfigError(f"--output {path}: the folder {folder} does not exist (create it first)")
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(f"--output {path}: the file exists and cannot be overwritten (no write permission)")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=f".{path.name}.", suffix=".tmp"):
            pass
    except OSError as exc:
        raise ConfigError(f"--output {path}: cannot write in the folder {folder} ({exc.strerror or exc})") from None


def check_say(text: str, overrides: dict, output: Path, voice: str, model_dir: Path, catalog: dict, *,
              llm_text: bool):
    """Every check of ``say`` in the order a user reads the command; returns the resolved, installed voice and the
    text to speak, through the LLM text stage when ``llm_text`` is on (``model_dir`` and ``catalog``, the keywords
    of the voice lookups, are the CLI's: :func:`..cli.resolve_places`)."""
    from .assets.catalog import resolve_voice

    check_options(overrides)  # a bad --lang first: the text check uses it
    try:  # the voice's language reads the text as the engine would (URLs, e-mails); its error is reported last
        spec, voice_error = resolve_voice(voice, model_dir, **catalog), None
    except Exception as exc:  # noqa: BLE001 - raised below, after the checks a user reads first
        spec, voice_error = None, exc
    spoken = check_text(text, overrides.get("text_lang") or (spec.language if spec else None), llm_text)
    check_output(output)
    if voice_error is not None:
        raise voice_error
    return spec, spoken
