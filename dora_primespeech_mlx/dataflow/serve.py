"""The node's process around the :class:`.handler.MessageHandler`, without dora: how the engine is built, how the
start is reported, signals, the daemon watch, and the one way out (:func:`leave`). ``node.py`` keeps only the
dora event loop and calls :class:`Service`.

- **Start**: the worker builds the engine (:func:`engine_factory`) while the main thread reads events: texts wait in
  the queue, a STOP or signal is answered at once. Then ``status: ready`` goes out before any text is spoken, or
  the failure (``error_stage: init``), every text answered as cancelled and exit code 2.
- **Stop** (STOP, SIGTERM, SIGINT): the text in flight and every queued one answered as cancelled, the worker given
  ``STOP_GRACE_S`` to park, exit code 0 within a second, start-up included.
- **End of inputs**: the queued texts are spoken, then exit code 0. **Daemon lost**: exit code 1 at once.

docs/dataflow.md ("Outputs", the paragraph on stopping) says it for users."""

from __future__ import annotations

import importlib.metadata
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import ConfigError, VoiceNotFoundError, VoiceNotInstalledError
from ..settings import Settings
from .handler import EngineFactory, MessageHandler
from .transport import DirectTransport, OutboxTransport, Send

POLL_S = 0.05  # how often the 0.3.x node form drains the outbox while it waits
STOP_GRACE_S = 0.7  # after STOP, how long the worker may take to reach a cancellation point (exit within 1 s)
PARENT_WATCH_S = 0.5  # how often a daemon-spawned node checks that its parent process is still there
DAEMON_LOST = ("daemon channel broken", "fatal event stream error")  # dora 1.1's ERROR event when the daemon died
# The operator form cannot leave a worker inside the engine to the runtime's teardown (a thread inside MLX then
# aborts the process): when its worker has not parked STOP_GRACE_S after a STOP, it leaves the process itself
# (code 0, which dora reports as finished) after giving the runtime this long to pass on the answers just sent.
OPERATOR_DRAIN_S = 0.2
SIGNALS = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT"}  # each answered as STOP is


def leave(code: int) -> None:
    """The one way the node's process ends: flush stdout and stderr, then ``os._exit(code)``.

    Why not return from ``main``: a thread that used MLX (the worker, which may still be inside a long SoVITS
    step, or parked) aborts the process when the interpreter tears it down ("terminate called without an active
    exception", code 134), the teardown of the loaded models and text front ends takes seconds on a busy machine,
    and dora's ``next()`` may hold the main thread for ever (a SIGTERM is answered from another thread)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a pipe to a daemon that is gone
            pass
    os._exit(code)


def engine_factory(settings: Settings) -> EngineFactory:
    """The handler's engine factory: ``progress -> (engine, start voice)``
    (:func:`dora_primespeech_mlx.engine.startup.start_engine`)."""

    def build(progress: Callable[[str], None]):
        from ..engine.startup import start_engine

        return start_engine(settings, progress)

    return build


def start_failure(handler: MessageHandler) -> str | None:
    """None when the engine is ready, else the message to report (and the node exits with code 2)."""
    return None if handler.startup_error is None else start_failure_of(handler.startup_error)


def start_failure_of(exc: BaseException) -> str:
    """The message for a start that raised ``exc``."""
    hint = ""
    if isinstance(exc, VoiceNotFoundError) and not isinstance(exc, VoiceNotInstalledError):
        hint = " (set VOICE_NAME to one of the listed voices; `primespeech-mlx voices` lists them)"
    return f"cannot start: {exc}{hint}"


def report_start_failure(handler: MessageHandler, message: str, error: str) -> None:
    """Say once why the node cannot start: the whole message (headline, the missing files, the command that fixes
    it: :func:`~.assets.catalog.not_installed_message`) on stderr and ``log`` as the node's last lines (dora 1.x
    shows a failed node's stderr in its exit report and in the dataflow's summary, the end of ``dora run``'s
    output), and on ``status`` (``error_stage: init``) for the other nodes."""
    handler.log("ERROR", message)
    handler.status("error", level="ERROR", message=message, error=error, error_stage="init")


def announce(handler: MessageHandler, voice=None) -> None:
    """``status: ready`` with the start voice (``voice``: the factory's, before the handler holds it)."""
    voice = voice if voice is not None else handler.voice
    handler.status("ready", voice=voice.name, language=voice.language, streaming=handler.settings.streaming,
                   message=f"ready, voice {voice.name}")


def sends_from_worker(settings: Settings) -> bool:
    """Whether the worker may call ``send_output`` while the main thread waits in ``next()``: yes on dora-rs 1.x
    (``Node`` methods take ``&self``; verified with 1.1), no on 0.3.x (``next()`` borrows the node mutably:
    outputs are funnelled through the main thread, which polls with ``next(timeout)``). Polling is avoided on
    1.x because its ``next(timeout)`` loses events now and then. ``PRIMESPEECH_DORA_SENDS`` overrides."""
    if settings.dora_sends != "auto":
        return settings.dora_sends == "worker"
    try:
        return int(importlib.metadata.version("dora-rs").split(".")[0]) >= 1
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return True


def daemon_lost(event: dict) -> bool:
    """Whether an ERROR event says the connection to the daemon is gone (dora 1.1 then never sends another)."""
    error = str(event.get("error", "")).lower()
    return event.get("type") == "ERROR" and any(marker in error for marker in DAEMON_LOST)


def leave_orphaned(reason: str) -> None:
    """Exit at once (code 1) after losing the daemon: nothing can be sent any more."""
    try:
        sys.stderr.write(f"[primespeech] ERROR {reason}; exiting\n")
    except (OSError, ValueError):  # stderr was a pipe to the daemon
        pass
    leave(1)


def watch_parent(settings: Settings, on_lost: Callable[[str], None] = leave_orphaned) -> threading.Thread | None:
    """When a dora daemon spawned this process (``DORA_NODE_CONFIG``): a thread that calls ``on_lost`` once the
    parent process is gone (the daemon was killed: this process is re-parented). None otherwise (a dynamic node,
    the operator runtime's process, a parent that is already gone)."""
    if settings.dora_node_config is None:
        return None
    parent = os.getppid()
    if parent <= 1:
        return None

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_WATCH_S)
        on_lost(f"the dora daemon that started this node (pid {parent}) is gone")

    thread = threading.Thread(target=watch, name="primespeech-parent-watch", daemon=True)
    thread.start()
    return thread


class Signals:
    """SIGTERM and SIGINT, answered like STOP whatever the main thread is doing: ``on_signal(name)`` once.

    The signal may reach any thread, and the main thread may sit inside dora's ``next()`` (Rust code, which runs
    no Python signal handler until an event arrives; Python's own SIGINT handler would raise KeyboardInterrupt
    out of it), so the Python handlers do nothing themselves: the signal module's C handler writes the signal's
    number to a pipe (``signal.set_wakeup_fd``) and a thread waiting on that pipe calls ``on_signal``. Install
    from the main thread, after ``Node()`` (the last handler wins)."""

    def __init__(self, on_signal: Callable[[str], None]):
        self._on_signal = on_signal
        self._read, write = os.pipe()
        os.set_blocking(write, False)
        for number in SIGNALS:
            signal.signal(number, lambda signum, frame: None)
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        threading.Thread(target=self._watch, name="primespeech-signals", daemon=True).start()

    def _watch(self) -> None:
        while True:
            try:
                data = os.read(self._read, 64)
            except InterruptedError:
                continue
            if not data:
                return
            for number in data:
                if number in SIGNALS:
                    self._on_signal(SIGNALS[number])


class Service:
    """The node form's process: the handler, its transport and how it ends. ``send`` is dora's ``send_output``;
    ``direct``: the worker sends itself (:func:`sends_from_worker`), else outputs wait in an outbox that the main
    thread drains with :meth:`flush`.

    Ending: :meth:`stop` (STOP from the main thread; a signal or a failed start from another thread) and
    :meth:`finish` (the inputs closed) answer what they must and return the exit code for :func:`leave`. A thread
    other than the main one leaves itself when the worker sends (the main thread may be inside ``next()`` for
    ever); with an outbox it asks the main thread (:attr:`ending`), which alone may send."""

    def __init__(self, settings: Settings, factory: EngineFactory, send: Send, direct: bool):
        self.direct, self._send = direct, send
        self.transport = DirectTransport(send) if direct else OutboxTransport()
        self.handler = MessageHandler(settings, self._starting(factory), self.transport)
        self.ending: tuple[str, float, int] | None = None  # (reason, since, exit code): asked of the main thread
        self._once = threading.Lock()  # the first stop answers; a second waits for the exit
        self._failure: str | None = None  # the message of a failed start (on status at once, logged last)

    def start(self, bad: ConfigError | None = None) -> bool:
        """Start serving; False (reported) when the settings are bad."""
        if bad is not None:
            report_start_failure(self.handler, str(bad), str(bad))
            return False
        Signals(lambda name: self._ask(name, 0))
        self.handler.start()
        return True

    def flush(self) -> None:
        if self._send is not None:
            self.transport.flush(self._send)

    def detach(self) -> None:
        """Send what is queued and let go of dora's ``send_output`` (with an outbox nothing else holds the node:
        the caller's ``del`` then lets dora close it before the process leaves)."""
        self.flush()
        self._send = None

    def _starting(self, factory: EngineFactory) -> EngineFactory:
        """``factory``, announcing the start voice (before the worker runs any text) or reporting the failure."""

        def build(progress: Callable[[str], None]) -> tuple[Any, Any]:
            try:
                engine, voice = factory(progress)
            except BaseException as exc:
                # reported by the stop, after the texts received meanwhile are answered: the message stays the
                # node's last lines (dora shows only the end of a failed node's stderr)
                message = start_failure_of(exc)
                self.handler.status("error", level="ERROR", message=message, error=str(exc), error_stage="init")
                self._failure = message
                self._ask("start failure", 2)
                raise
            announce(self.handler, voice)
            return engine, voice

        return build

    def _ask(self, reason: str, code: int) -> None:
        """From a thread other than the main one: end now (the worker sends) or have the main thread end."""
        since = time.monotonic()
        if self.direct:
            leave(self.stop(reason, since, code))
        elif self.ending is None:
            self.ending = (reason, since, code)

    def stop(self, reason: str, since: float, code: int = 0) -> int:
        """Answer the text in flight and every queued one as cancelled, give the worker ``STOP_GRACE_S`` to park,
        and return ``code``. A second stop (a SIGTERM after the STOP) waits for the first one's exit."""
        if not self._once.acquire(blocking=False):
            threading.Event().wait()
        n = self.handler.stop()
        self.flush()
        if self.handler.ready.is_set() and self.handler.startup_error is None:  # (else no text runs)
            self.handler.parked.wait(STOP_GRACE_S)
        self.handler.log("INFO", f"{reason}: {n} text(s) answered as cancelled; exiting "
                                 f"{time.monotonic() - since:.2f} s after the {reason}")
        if self._failure is not None:
            self.handler.log("ERROR", self._failure)
        self.flush()
        return code

    def finish(self) -> int:
        """The inputs closed: speak what is queued, then return 0 (or stop, when a signal comes meanwhile)."""
        if not self.direct:
            while not self.handler.wait_idle(POLL_S) and self.ending is None:
                self.flush()
            if self.ending is not None:
                return self.stop(*self.ending)
        self.handler.finish()
        self.flush()
        self.handler.parked.wait(STOP_GRACE_S)
        return 0

