"""What the demo nodes read from the TTS node's ``status`` output: whether it could not start.

The TTS node reports a failed start (missing voice files, invalid settings) once, on its ``status`` output with
``error_stage: "init"`` and on its own stderr, then exits. A demo node that sees this ends with one line that
points at that message instead of waiting for answers that cannot come.
"""

from __future__ import annotations


class TTSNotStarted(Exception):
    """The TTS node reported that it cannot start; the message is the headline of its error."""


def start_failure(body) -> str | None:
    """The headline of the TTS node's start-up error when ``body`` (a decoded ``status`` message) is one."""
    if not isinstance(body, dict) or body.get("status") != "error" or body.get("error_stage") != "init":
        return None
    message = str(body.get("error") or body.get("message") or "").strip()
    first = message.splitlines()[0] if message else "unknown error"
    if first.endswith(":") and "; " in first:  # a clause that introduces the lines below ("; missing:")
        return first.rsplit("; ", 1)[0]
    return first.rstrip(" :;,")


def ended_line(node: str) -> str:
    """The one line a demo node ends with when the TTS node did not start (the why is said once, by that node, in
    the last lines of dora's output)."""
    return f"{node}: stopped: the TTS node could not start; its message (at the end) says why and what to do"
