"""Errors raised by the text front end."""

from __future__ import annotations


class TextFrontendError(ValueError):
    """The text front end cannot turn this input into phonemes, or its data is missing/corrupt."""


class UnsupportedLanguageError(TextFrontendError):
    """A language (or language option) the front end does not support was requested."""


class MissingExtraError(TextFrontendError):
    """A language front end needs an optional dependency (a pip extra) that is not installed."""
