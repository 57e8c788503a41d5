"""Runtime parameters (dora 1.x: ``dora param set NODE KEY VALUE``; the node receives a ``PARAM_UPDATE`` event with
the key and the JSON value, ``PARAM_DELETED`` when one is deleted). Each maps onto what a ``control`` or a setting
already does, in send order among the texts (through the intake, as ``change_voice``):

- ``voice``: the ``change_voice`` control (answered ``voice_changed``, or ``error`` keeping the old voice);
- ``speed``, ``language``: the default ``speed`` / ``language`` of the texts after it (a text's own JSON keys win;
  deleted or ``null``: the voice's own again);
- ``streaming``, ``log_level``: the STREAMING / LOG_LEVEL settings from the next text on.

Every other answer is a ``status`` ``parameter_set`` (``parameter``, ``value``) or an ``error`` naming the
parameter; ``dora param list NODE`` lists the values set (the node's ``ready`` status lists the keys it reads)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ..defaults import RANGES
from ..settings import LOG_LEVELS, OLD_LANGS
from .messages import NAME_MAX_CHARS, ControlCommand, clip

PARAMETERS = {
    "voice": "the voice of the texts after it (as the control change_voice:NAME)",
    "speed": f"speech speed of the texts after it, {RANGES['speed_factor'].lo:g}..{RANGES['speed_factor'].hi:g} "
             "(null: the voice's)",
    "language": f"text language of the texts after it: {', '.join(OLD_LANGS)} (null: the voice's)",
    "streaming": "true: audio in chunks while the GPT generates (STREAMING)",
    "log_level": f"lowest level sent on `log`: {', '.join(LOG_LEVELS)} (LOG_LEVEL)",
}
OVERRIDES = {"speed": "speed_factor", "language": "text_lang"}  # parameter -> request override key


class ParameterError(ValueError):
    """A parameter the node does not know, or a value it cannot take; the message says which are accepted."""


@dataclasses.dataclass(frozen=True)
class SetParameter:
    """The control job of a parameter (``name``: what the handler dispatches on)."""

    key: str
    value: Any
    name: str = "set_parameter"


def parameter_event(event: dict) -> tuple[str, Any] | None:
    """(key, value) of a dora ``PARAM_UPDATE`` event (``id``: the key, ``value``: the JSON value as Python), (key,
    None) of a ``PARAM_DELETED``; None for every other event."""
    kind = event.get("type")
    if kind == "PARAM_UPDATE":
        return str(event.get("id")), event.get("value")
    if kind == "PARAM_DELETED":
        return str(event.get("id")), None
    return None


def command(key: str, value: Any) -> ControlCommand | SetParameter:
    """The control a parameter update stands for (``value`` None: deleted, back to the default); raises
    :class:`ParameterError` for an unknown key or a bad value."""
    if key not in PARAMETERS:
        raise ParameterError(f"unknown parameter {clip(key)!r} (known: {', '.join(PARAMETERS)})")
    if key == "voice":
        if not isinstance(value, str) or not value.strip() or len(value) > NAME_MAX_CHARS:
            raise ParameterError(f"parameter voice: expected a voice name (a JSON string, e.g. '\"Doubao\"'), "
                                 f"not {clip(json.dumps(value, ensure_ascii=False))}")
        return ControlCommand("change_voice", value.strip())
    return SetParameter(key, _checked(key, value))


def _checked(key: str, value: Any) -> Any:
    if value is None:
        if key in OVERRIDES:
            return None
        raise ParameterError(f"parameter {key}: expected a value")
    if key == "speed":
        rng = RANGES["speed_factor"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not rng.contains(float(value)):
            raise ParameterError(f"parameter speed: {clip(value)!r} {rng.describe()}")
        return float(value)
    if key == "language":
        lang = str(value).strip().lower() if isinstance(value, str) else None
        if lang not in OLD_LANGS:
            raise ParameterError(f"parameter language: {clip(value)!r} is not one of {', '.join(OLD_LANGS)}")
        return lang
    if key == "streaming":
        if not isinstance(value, bool):
            raise ParameterError(f"parameter streaming: expected true or false, not {clip(value)!r}")
        return value
    level = str(value).strip().upper() if isinstance(value, str) else None
    level = "WARNING" if level == "WARN" else level
    if level not in LOG_LEVELS:
        raise ParameterError(f"parameter log_level: {clip(value)!r} is not one of {', '.join(LOG_LEVELS)}")
    return level


class Parameters:
    """The request defaults set by parameters (``speed``, ``language``), applied beneath each text's own keys."""

    def __init__(self):
        self.overrides: dict[str, Any] = {}

    def request(self, overrides: dict) -> dict:
        """A text's overrides with the parameters' defaults beneath them."""
        return {**self.overrides, **overrides} if self.overrides else overrides

    def apply(self, cmd: SetParameter, handler) -> str:
        """On the worker, in send order: make ``cmd`` hold from the next text on; the answer's message."""
        if cmd.key in OVERRIDES:
            if cmd.value is None:
                self.overrides.pop(OVERRIDES[cmd.key], None)
                return f"{cmd.key}: the voice's own from the next text on"
            self.overrides[OVERRIDES[cmd.key]] = cmd.value
        else:
            handler.settings = dataclasses.replace(handler.settings, **{cmd.key: cmd.value})
        return f"{cmd.key} = {json.dumps(cmd.value)} from the next text on"

    def current(self, settings) -> dict[str, Any]:
        """The values in force now (for the ``ready`` and ``parameter_set`` answers)."""
        inverse = {v: k for k, v in OVERRIDES.items()}
        values = {inverse[k]: v for k, v in self.overrides.items()}
        return {"streaming": settings.streaming, "log_level": settings.log_level, **values}
