"""The metadata of what arrives on the node's inputs, made sendable: pure functions, no Dora, no models.

:func:`sanitize_metadata` keeps every incoming key with its type, except values Dora cannot send faithfully
(numpy scalars become int/float/bool, None/dict/bytes/mixed lists become strings, ints outside int64 and
non-finite floats their string) and values beyond the ``METADATA_MAX_*`` bounds (dropped), and
:func:`normalize_segment_index` makes a numeric ``segment_index`` an int (within int64), as the old node read it."""

from __future__ import annotations

import datetime as _dt
import json
import math
from typing import Any

import numpy as np

_PLAIN = (str, bool, int, float, _dt.datetime)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # dora's integer metadata is an i64: a larger int cannot be sent
# Bounds on what the node echoes of an input's metadata (each output carries it): larger values are dropped,
# with a WARNING on ``log`` (docs/dataflow.md, "Outputs").
METADATA_MAX_KEYS = 64  # keys of one input's metadata (the rest are dropped)
METADATA_MAX_CHARS = 4096  # a key, a string value, or the JSON form of a dict / mixed list
METADATA_MAX_ITEMS = 1024  # items of a list value
METADATA_MAX_DEPTH = 8  # nesting of a dict / list value (sent as its JSON form)


class Unsendable(ValueError):
    """A metadata value the node does not echo; the message says why."""


def sanitize_value(value: Any, notes: list[str] | None = None) -> Any:
    """A metadata value Dora can send as is (docs/dataflow.md, "Outputs"): numpy scalars become
    int/float/bool, None/dict/bytes/mixed lists their string (JSON) form; an int outside int64 or a non-finite
    float becomes its string (a line in ``notes``). Raises :class:`Unsendable` for a value beyond the bounds
    above (too long, too deep)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) or isinstance(value, _dt.datetime):
        return value
    if isinstance(value, int):
        if INT64_MIN <= value <= INT64_MAX:
            return value
        _note(notes, "an integer outside int64, sent as a string")
        return _bounded(_str(value))
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        _note(notes, f"{value}, sent as a string")
        return str(value)
    if isinstance(value, str):
        return _bounded(value)
    if isinstance(value, (list, tuple)):
        return _list_value(value, notes)
    if isinstance(value, dict):
        return _json_value(value)
    if isinstance(value, (bytes, bytearray)):
        return _bounded(bytes(value[: METADATA_MAX_CHARS * 4 + 1]).decode("utf-8", errors="replace"))
    return _bounded(_str(value))


def _list_value(value: list | tuple, notes: list[str] | None) -> Any:
    if len(value) > METADATA_MAX_ITEMS:
        raise Unsendable(f"a list of {len(value)} items (at most {METADATA_MAX_ITEMS})")
    items = [v.item() if isinstance(v, np.generic) else v for v in value]
    kinds = {type(v) for v in items}
    if not items:
        return items
    if kinds == {int} and all(INT64_MIN <= v <= INT64_MAX for v in items):
        return items
    if kinds in ({float}, {int, float}):
        floats = _floats(items)
        if floats is not None:
            return floats
    if kinds == {str}:
        return [_bounded(v) for v in items]
    if kinds <= {int, float}:
        _note(notes, "a number list with values dora cannot send (outside int64, not finite), sent as JSON")
    return _json_value(items)


def _floats(items: list) -> list[float] | None:
    """``items`` as finite floats, or None (an int too large for a float, inf, nan)."""
    try:
        floats = [float(v) for v in items]
    except OverflowError:
        return None
    return floats if all(math.isfinite(f) for f in floats) else None


def _json_value(value: Any) -> str:
    """The JSON form of a dict or list value, within METADATA_MAX_DEPTH and METADATA_MAX_CHARS."""
    if _depth(value, METADATA_MAX_DEPTH) > METADATA_MAX_DEPTH:
        raise Unsendable(f"nested more than {METADATA_MAX_DEPTH} levels deep")
    try:
        text = json.dumps(value, default=str, ensure_ascii=False)
    except (ValueError, TypeError, RecursionError) as exc:
        raise Unsendable(f"no JSON form ({type(exc).__name__})") from None
    return _bounded(text)


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of dicts/lists in ``value``, counted without recursion and only up to ``limit + 1``."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, (dict, list, tuple)):
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list, tuple)))
    return deepest


def _str(value: Any) -> str:
    try:
        return str(value)
    except Exception as exc:  # an int of more than 4300 digits, an object whose str() fails
        raise Unsendable(f"no string form ({type(exc).__name__})") from None


def _bounded(text: str) -> str:
    if len(text) > METADATA_MAX_CHARS:
        raise Unsendable(f"{len(text)} characters (at most {METADATA_MAX_CHARS})")
    return text


def _note(notes: list[str] | None, message: str) -> None:
    if notes is not None:
        notes.append(message)


def sanitize_metadata(metadata: Any, problems: list[str] | None = None) -> dict[str, Any]:
    """Incoming metadata made safe to send back: every key kept (as str), values per :func:`sanitize_value`.
    What is dropped or sent as a string beyond the usual conversions (a value beyond the bounds above, an int
    outside int64, a non-finite float, keys beyond METADATA_MAX_KEYS) is described in ``problems``."""
    if not isinstance(metadata, dict):
        return {}
    out: dict[str, Any] = {}
    notes: list[str] = []
    for n, (k, v) in enumerate(metadata.items()):
        if n == METADATA_MAX_KEYS:
            notes.append(f"{len(metadata) - n} key(s) beyond the first {METADATA_MAX_KEYS} dropped")
            break
        try:
            key = _bounded(k if isinstance(k, str) else _str(k))
        except Unsendable as exc:
            notes.append(f"a key of {exc}: dropped")
            continue
        label = repr(key[:40])
        try:
            before = len(notes)
            out[key] = sanitize_value(v, notes)
            notes[before:] = [f"{label}: {note}" for note in notes[before:]]
        except Unsendable as exc:
            notes.append(f"{label}: {exc}: dropped")
    if problems is not None:
        problems.extend(notes)
    return out


def normalize_segment_index(md: dict[str, Any]) -> bool:
    """Make a numeric ``segment_index`` an int in place (the MaaS LLM client sends "0"; the players do
    ``segment_index + 1`` and the old node parsed it with ``int()``). Returns False when a segment_index is
    present but not numeric (it is then left as it came)."""
    if "segment_index" not in md:
        return True
    number = _whole(md["segment_index"])
    if number is None or not INT64_MIN <= number <= INT64_MAX:  # (beyond int64 dora cannot send it as an int)
        return False
    md["segment_index"] = number
    return True


def _whole(raw: Any) -> int | None:
    """The whole number ``raw`` stands for (an int, a whole float, a string of either), else None."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str):
        try:
            return int(raw.strip())  # exact, also beyond a float's 53 bits
        except ValueError:
            pass
    try:
        number = float(raw.strip()) if isinstance(raw, str) else float(raw)
    except (TypeError, ValueError, OverflowError):
        return None
    return int(number) if math.isfinite(number) and number == int(number) else None


def as_int(value: Any, default: int | None = None) -> int | None:
    """``int(value)`` for ints, floats and numeric strings (``segment_index`` may be "0"); else default."""
    if isinstance(value, bool):
        return int(value)
    try:
        if isinstance(value, str):
            value = value.strip()
        x = float(value)
        return int(x) if math.isfinite(x) else default
    except (TypeError, ValueError):
        return default
