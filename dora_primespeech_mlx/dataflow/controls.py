"""Answers to the ``control`` commands: those that report or tidy (``stats``, ``list_voices``, ``cleanup``) and
``change_voice``, each one ``status`` message; a failing command is answered with an error status and the node
goes on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .messages import ERROR_MAX_CHARS, clip


def answer(cmd, md: dict, engine, voice, counts: dict, queued: int, status: Callable[..., None],
           log: Callable[[str, str], None], sessions: dict | None = None) -> None:
    """Run ``cmd`` against ``engine`` and send its answer through ``status(status, md, **fields)``; ``sessions``:
    the per-session counts ``stats`` reports."""
    try:
        if cmd.name == "stats":
            status("stats", md, stats=jsonable(engine.stats()), node_counts=counts, voice=voice.name, queued=queued,
                   sessions=sessions or {}, message=f"{counts['texts']} text(s), voice {voice.name}")
        elif cmd.name == "list_voices":
            voices = jsonable(engine.list_voices())
            status("voices", md, voices=voices, current=voice.name,
                   message=f"{len(voices)} voice(s), current {voice.name}")
        elif cmd.name == "cleanup":
            freed = engine.cleanup() if hasattr(engine, "cleanup") else None
            status("cleanup", md, freed=jsonable(freed), message="caches freed")
    except Exception as exc:
        log("ERROR", f"control {cmd.name} failed: {exc}")
        status("error", md, level="ERROR", message=str(exc), error=str(exc), command=cmd.name)


def change_voice(name: str, md: dict, st, voices, engine, jobs, status: Callable[..., None],
                 log: Callable[[str, str], None]) -> None:
    """Make ``name`` the current voice (:meth:`.voices.Voices.change`, in send order ``st``); the jobs queued then
    (``jobs``: the :class:`.jobs.JobQueue`) resolve their voice again at their turn. On any failure the previous
    voice stays current."""
    old = voices.current
    try:
        log("INFO", f"loading voice {name} ...")
        spec, old = voices.change(name, engine, st)
    except Exception as exc:  # any failure: the previous voice stays current
        error = clip(exc, ERROR_MAX_CHARS)
        log("ERROR", f"change_voice failed, keeping {old.name}: {error}")
        status("error", md, level="ERROR", message=error, error=error, command="change_voice", voice=old.name)
        return
    for job in jobs.queued():
        job.voice = None  # resolved before this change: resolved again at its turn
    log("INFO", f"voice changed to {spec.name} ({spec.language})")
    status("voice_changed", md, voice=spec.name, language=spec.language, previous=old.name,
           message=f"voice {spec.name}")


def jsonable(x: Any) -> Any:
    """Dataclasses, Paths and numpy values made JSON-friendly."""
    if hasattr(x, "__dataclass_fields__"):
        x = {k: getattr(x, k) for k in x.__dataclass_fields__}
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    if x is None or isinstance(x, (str, int, float, bool)):
        return x
    return str(x)
