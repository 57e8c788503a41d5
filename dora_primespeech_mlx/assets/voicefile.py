"""Reading a voice YAML file the way a config file should be read: bounded, without aliases, keys checked.

A voice file is small (a dozen short keys), so anything else is refused before it costs time or memory:

- only a regular file (a FIFO or device would block the reader) of at most :data:`MAX_FILE_BYTES`, checked with
  ``os.stat`` and again while reading;
- no YAML aliases (``*ref``): ``yaml.safe_load`` expands them, so a kilobyte of nested aliases becomes
  gigabytes ("billion laughs"); no structure nested deeper than :data:`MAX_DEPTH`;
- a mapping of at most :data:`MAX_KEYS` keys, each one the loader knows; an unknown key is named with the
  nearest known one (``promt_text`` -> ``prompt_text``), as an error or, with ``unknown_keys="warn"``, a warning.

Errors are :class:`ConfigError` naming the file and the limit.
"""

from __future__ import annotations

import difflib
import logging
import os
import stat
from pathlib import Path

import yaml

from ..errors import ConfigError

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 64 * 1024  # a voice file is a few hundred bytes; its transcript at most a few hundred characters
MAX_KEYS = 64
MAX_DEPTH = 8

VOICE_KEYS = ("name", "language", "reference", "prompt_text", "prompt_lang", "speed_factor", "description",
              "gpt", "sovits", "hubert", "bert", "sv", "repository", "revision")
ENCODER_KEYS = ("repository", "revision", "hubert", "bert", "hubert_files", "bert_files", "sv")
UNKNOWN_KEY_POLICIES = ("error", "warn")
_warned: set[str] = set()


class _NoAliasLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses aliases and deep nesting while composing (before anything is built)."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, f"YAML aliases (*{event.anchor}) are not allowed in a "
                                              "voice file", event.start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels",
                                                  self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def read_bounded(path: Path, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; ConfigError otherwise (nothing blocks: the type
    is checked with ``stat`` before opening, ``O_NONBLOCK`` covers a file swapped for a FIFO in between)."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{path}: a voice file must be a regular file")
        if st.st_size > limit:
            raise ConfigError(f"{path}: voice file of {st.st_size} bytes is over the limit of {limit} bytes")
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ConfigError(f"{path}: a voice file must be a regular file")
            data = f.read(limit + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read voice file ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise ConfigError(f"{path}: voice file is over the limit of {limit} bytes")
    return data


def parse(path: Path, data: bytes) -> dict:
    """The mapping in ``data`` (a voice file's bytes); ConfigError for bad YAML, aliases, deep nesting, or a
    document that is not a mapping of at most :data:`MAX_KEYS` keys."""
    try:
        text = data.decode("utf-8")
        loader = _NoAliasLoader(text)
        try:
            doc = loader.get_single_data()
        finally:
            loader.dispose()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: a voice file must be UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not a valid voice file ({_short(exc)})") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: a voice file must be a YAML mapping")
    if len(doc) > MAX_KEYS:
        raise ConfigError(f"{path}: {len(doc)} keys; a voice file has at most {MAX_KEYS}")
    return doc


def check_keys(path: Path, doc: dict, known: tuple[str, ...], policy: str = "error") -> None:
    """Refuse (policy ``error``) or log (``warn``) the keys of ``doc`` not in ``known``, each named with the
    nearest known key."""
    unknown = [k for k in doc if k not in known]
    if not unknown:
        return
    parts = []
    for key in unknown:
        shown = str(key)[:60]
        near = difflib.get_close_matches(str(key), known, n=1)
        parts.append(f"unknown key {shown!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
    message = (f"{path}: {'; '.join(parts)}. Known keys: {', '.join(known)} "
               "(PRIMESPEECH_VOICE_UNKNOWN_KEYS=warn makes this a warning)")
    if policy == "warn":
        if message not in _warned:  # once per file and keys, not at every lookup
            if len(_warned) >= 512:
                _warned.clear()
            _warned.add(message)
            log.warning("%s", message)
        return
    raise ConfigError(message)


def _short(exc: yaml.YAMLError) -> str:
    """The parser's reason and where (line, column), on one line of at most 300 characters."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if problem and mark is not None:
        text = f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    else:
        text = str(exc)
    text = " ".join(text.split())
    return text if len(text) <= 300 else text[:297] + "..."
