"""What arrives on the node's inputs, parsed into plain Python: pure functions, no Dora, no models.

``text`` input (one string, as the old dora-primespeech node read it): plain text, a JSON object, or a voice
prefix on the text (:func:`parse_text` gives the forms). ``control`` input: ``reset``, ``stats``,
``list_voices``, ``change_voice:NAME`` (also ``voice:NAME``), ``cleanup``, ``cancel`` (the session named by the
control's ``session_id``) and ``cancel:SESSION``. Their metadata: ``metadata.py``."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

VOICE_PREFIX = "VOICE:"
PREFIX_LANGS = ("zh", "en", "ja", "ko", "yue", "all_zh", "all_ja", "all_ko", "all_yue", "auto", "auto_yue")

# JSON payload keys -> SynthesisConfig overrides (and their types).
_FLOAT_KEYS = {
    "speed": "speed_factor", "speed_factor": "speed_factor", "top_p": "top_p", "temperature": "temperature",
    "repetition_penalty": "repetition_penalty", "fragment_interval": "fragment_interval",
    "noise_scale": "noise_scale",
}
_INT_KEYS = {"top_k": "top_k", "seed": "seed"}
_STR_KEYS = {"language": "text_lang", "text_lang": "text_lang", "lang": "text_lang",
             "text_split_method": "text_split_method"}
_IGNORED_WITH_WARNING = ("pitch",)


ECHO_CHARS = 200  # an error message quotes at most this much of the input it is about (:func:`clip`)
NAME_MAX_CHARS = 256  # a voice name (``VOICE:<name>|``, ``change_voice:``, JSON ``voice``)
PATH_MAX_CHARS = 4096  # a path in ``VOICE:CUSTOM`` / ``VOICE:TRAINED`` (Linux's PATH_MAX)
ERROR_MAX_CHARS = 2000  # the error a text or control is answered with (it may quote a path or a voice list)


def clip(text: Any, limit: int = ECHO_CHARS) -> str:
    """``text`` cut to ``limit`` characters for an error message, saying how long it was."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _check_length(what: str, value: str, limit: int) -> str:
    if len(value) > limit:
        raise InputError(f"{what} of {len(value)} characters (at most {limit}): {clip(value)!r}")
    return value


class InputError(ValueError):
    """A ``text`` or ``control`` value that cannot be used; the message says what is wrong."""


@dataclass
class VoiceChoice:
    """The voice a request asks for: a named voice, or a CUSTOM/TRAINED voice built from paths."""

    kind: str  # "name" | "custom" | "trained"
    name: str | None = None
    reference: str | None = None
    prompt_text: str | None = None
    lang: str | None = None
    gpt: str | None = None
    sovits: str | None = None


@dataclass
class TextRequest:
    """A parsed ``text`` input."""

    text: str
    voice: VoiceChoice | None = None  # None: the node's current voice
    overrides: dict[str, Any] = field(default_factory=dict)  # SynthesisConfig fields
    volume: float | None = None  # gain applied to the audio (Moxin payload `volume`)
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ControlCommand:
    name: str  # reset | stats | list_voices | change_voice | cleanup | cancel
    arg: str | None = None


# ---------------------------------------------------------------------------------------------------
# Arrow value -> str


def decode_text_value(value: Any) -> str:
    """The text carried by a ``text``/``control`` input value.

    Accepts a StringArray / LargeStringArray (elements joined by a space, nulls skipped), UTF-8 bytes in a
    UInt8Array / BinaryArray (a sender that used ``send_output(id, b"...")``), either dictionary-encoded, or a
    Python str/bytes.
    Anything else raises :class:`InputError`.
    """
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _utf8(bytes(value))
    if isinstance(value, pa.ChunkedArray):
        value = value.combine_chunks()
    if not isinstance(value, pa.Array):
        raise InputError(f"text input must be a string array, got {type(value).__name__}")
    if pa.types.is_dictionary(value.type):  # dictionary-encoded (a sender's pa.array(...).dictionary_encode())
        value = value.dictionary_decode()
    t = value.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return " ".join(s for s in value.to_pylist() if s is not None)
    if pa.types.is_uint8(t) or pa.types.is_int8(t):
        return _utf8(value.to_numpy(zero_copy_only=False).astype(np.uint8).tobytes())
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "".join(_utf8(b) for b in value.to_pylist() if b is not None)
    if pa.types.is_null(t):
        return ""
    raise InputError(f"text input must be a string array (UTF-8), got an Arrow array of type {t}")


def _utf8(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"text input is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None


# ---------------------------------------------------------------------------------------------------
# text


def parse_text(raw: str) -> TextRequest:
    """Parse one ``text`` input string (JSON payload and/or voice prefix); raises :class:`InputError`. Forms:

    - plain text;
    - a JSON object ``{"prompt" | "text": ..., "speed", "voice", "language", ...}``, possibly nested one more
      level (the prompt-input bridge wraps an already wrapped prompt): the inner prompt wins, the outer
      object fills the keys the inner one lacks. Valid JSON that is not an object (``42``, ``true``,
      ``null``, ``[1]``) and text that is not JSON at all are plain text;
    - a voice prefix on the text: ``VOICE:<name>|text``, ``VOICE:CUSTOM|<ref_wav>|<prompt_text>|<lang>|text``
      or ``VOICE:TRAINED|<gpt>|<sovits>|<ref_wav>|<prompt_text>|<lang>|text``. The split is limited, so the
      text itself may contain ``|``; a wrong field count gives a warning and the raw string is spoken."""
    payload = _json_object(raw)
    if payload is None:
        req = TextRequest(text=raw)
    else:
        req = _from_payload(payload)
    _apply_voice_prefix(req)
    return req


def _json_object(raw: str) -> dict | None:
    s = raw.strip()
    if not s.startswith("{"):
        return None
    try:
        obj = json.loads(s)
    except ValueError:
        return None  # malformed JSON is plain text
    return obj if isinstance(obj, dict) else None


def _prompt_of(obj: dict) -> Any:
    for key in ("prompt", "text"):
        if key in obj:
            return obj[key]
    return None


def _from_payload(outer: dict) -> TextRequest:
    prompt = _prompt_of(outer)
    inner = prompt if isinstance(prompt, dict) else _json_object(prompt) if isinstance(prompt, str) else None
    if inner is not None:  # one extra level: the inner prompt wins, the outer fills what is missing
        merged = {**{k: v for k, v in outer.items() if k not in ("prompt", "text")}, **inner}
        prompt = _prompt_of(inner)
    else:
        merged = outer
    if prompt is None:
        raise InputError("JSON text payload has no 'prompt' (or 'text') field")
    if not isinstance(prompt, str):
        raise InputError(f"JSON 'prompt' must be a string, got {type(prompt).__name__}")
    req = TextRequest(text=prompt)
    problems: list[str] = []
    for key, value in merged.items():
        if key in ("prompt", "text"):
            continue
        try:
            if key in _FLOAT_KEYS:
                req.overrides[_FLOAT_KEYS[key]] = _as_float(value)
            elif key in _INT_KEYS:
                req.overrides[_INT_KEYS[key]] = _as_int(value)
            elif key in _STR_KEYS:
                if not isinstance(value, str):
                    raise ValueError("expected a string")
                req.overrides[_STR_KEYS[key]] = value.strip().lower()
            elif key == "voice":
                if not isinstance(value, str) or not value.strip():
                    raise ValueError("expected a voice name")
                if len(value.strip()) > NAME_MAX_CHARS:
                    raise ValueError(f"a voice name of at most {NAME_MAX_CHARS} characters")
                req.voice = VoiceChoice("name", name=value.strip())
            elif key == "volume":
                req.volume = _as_float(value)
                if not 0.0 <= req.volume <= 10.0:
                    raise ValueError("must be within 0..10")
            elif key in _IGNORED_WITH_WARNING:
                req.warnings.append(f"JSON key {key!r} is not supported and was ignored")
        except ValueError as exc:
            problems.append(f"{key}={clip(repr(value))}: {clip(exc)}")
    if problems:
        raise InputError("bad JSON text payload: " + "; ".join(problems))
    return req


def _as_float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError("expected a number")
    x = float(value)
    if not math.isfinite(x):
        raise ValueError("expected a finite number")
    return x


def _as_int(value: Any) -> int:
    x = _as_float(value)
    if x != int(x):
        raise ValueError("expected a whole number")
    return int(x)


def _apply_voice_prefix(req: TextRequest) -> None:
    text = req.text
    if not text.startswith(VOICE_PREFIX):
        return
    rest = text[len(VOICE_PREFIX):]
    head = rest.split("|", 1)[0]
    if head in _PATH_FORMS:
        fields = _PATH_FORMS[head]
        parts = rest.split("|", len(fields) - 1)
        if len(parts) != len(fields):
            req.warnings.append(f"VOICE:{head} needs {len(fields)} '|'-separated fields, got {len(parts)}; "
                                "speaking the raw text")
            return
        got = dict(zip(fields, parts))
        for name in ("ref", "gpt", "sovits"):
            if name in got:
                _check_length(f"VOICE:{head} {name} path", got[name].strip(), PATH_MAX_CHARS)
        body = got["text"]
        req.voice = VoiceChoice(head.lower(), reference=got["ref"].strip(), prompt_text=got["prompt_text"],
                                lang=_prefix_lang(got["lang"]), gpt=got.get("gpt", "").strip() or None,
                                sovits=got.get("sovits", "").strip() or None)
    else:
        name, sep, body = rest.partition("|")
        if not sep or not name.strip():
            req.warnings.append("VOICE:<name>|<text> prefix without '|' or name; speaking the raw text")
            return
        req.voice = VoiceChoice("name", name=_check_length("VOICE: voice name", name.strip(), NAME_MAX_CHARS))
    req.text = body


# VOICE:<form>|... -> its '|'-separated fields (the first is the form's name itself)
_PATH_FORMS = {
    "CUSTOM": ("form", "ref", "prompt_text", "lang", "text"),
    "TRAINED": ("form", "gpt", "sovits", "ref", "prompt_text", "lang", "text"),
}


def _prefix_lang(lang: str) -> str:
    v = lang.strip().lower()
    return v if v in PREFIX_LANGS else "auto"


# ---------------------------------------------------------------------------------------------------
# control

_SIMPLE = ("reset", "stats", "list_voices", "cleanup")


def parse_control(raw: str) -> ControlCommand:
    """Parse one ``control`` input string; unknown commands raise :class:`InputError`."""
    s = raw.strip()
    low = s.lower()
    if low in _SIMPLE:
        return ControlCommand(low)
    if low == "cancel":  # one session's: the session_id of the control's metadata
        return ControlCommand("cancel")
    if low.startswith("cancel:"):
        session = s[len("cancel:"):].strip()
        if not session:
            raise InputError(f"control {s!r}: missing session after 'cancel:'")
        return ControlCommand("cancel", _check_length("cancel: session", session, NAME_MAX_CHARS))
    for prefix in ("change_voice:", "voice:"):
        if low.startswith(prefix):
            name = s[len(prefix):].strip()
            if not name:
                raise InputError(f"control {s!r}: missing voice name after {prefix!r}")
            return ControlCommand("change_voice", _check_length("change_voice: voice name", name, NAME_MAX_CHARS))
    raise InputError(
        f"unknown control command {clip(s)!r} (known: reset, stats, list_voices, change_voice:NAME, cleanup, "
        "cancel, cancel:SESSION)"
    )
