"""The Dora node: a drop-in replacement for the old ``dora-primespeech`` node. A thin adapter: the logic lives in
:mod:`.handler` (independent of dora), outputs go through a :mod:`.transport`, the models in the engine.

Two ways to run it: ``path: dora-primespeech-mlx`` (console script :func:`main`), the usual form, or
``operator: {python: dora_primespeech_mlx/node.py, inputs: ..., outputs: ...}`` (class :class:`Operator`).
Only the Dora API subset shared by dora-rs 0.3.x and 1.x is used: ``Node()``, ``node.next()`` /
``node.next(timeout)``, ``event["type" | "id" | "value" | "metadata"]`` and ``send_output(id, pa.Array, dict)``.

Inputs: ``text`` (plain text, JSON payload, ``VOICE:`` prefixes; see :mod:`.messages`), ``control`` (reset,
stats, list_voices, change_voice:NAME, cleanup) and ``reset`` (any value: same as the control command).
Outputs: ``audio``, ``segment_complete``, ``status``, ``log`` (see the README and :mod:`.handler`). How it stops
and how it leaves when the daemon is lost: :func:`main` and docs/dataflow.md."""

from __future__ import annotations

import gc
import importlib.metadata
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from dora_primespeech_mlx.dataflow.handler import WATCH_S, MessageHandler
from dora_primespeech_mlx.dataflow.params import parameter_event
from dora_primespeech_mlx.dataflow.transport import DirectTransport, OutboxTransport

# Absolute imports: the operator runtime loads this file by path, as a top-level module.
from dora_primespeech_mlx.errors import ConfigError, VoiceNotFoundError, VoiceNotInstalledError
from dora_primespeech_mlx.settings import Settings, use_reliable_zenoh

if TYPE_CHECKING:
    from dora_primespeech_mlx.text.options import TextData

POLL_S = 0.05  # how often the 0.3.x node form drains the outbox while the worker is busy
STOP_GRACE_S = 0.7  # after STOP, how long the worker may take to reach a cancellation point (exit within 1 s)
PARENT_WATCH_S = 0.5  # how often a daemon-spawned node checks that its parent process is still there
DAEMON_LOST = ("daemon channel broken", "fatal event stream error")  # dora 1.1's ERROR event when the daemon died
# The operator form cannot leave a worker inside the engine to the runtime's teardown (a thread inside MLX then
# aborts the process): when its worker has not parked STOP_GRACE_S after a STOP, it leaves the process itself
# (code 0, which dora reports as finished) after giving the runtime this long to pass on the answers just sent.
OPERATOR_DRAIN_S = 0.2


def engine_factory(settings: Settings) -> Callable[[Callable[[str], None]], tuple[Any, Any]]:
    """A factory that builds the engine, loads the start voice and warms up, reporting progress."""

    def build(progress: Callable[[str], None]):
        from dora_primespeech_mlx.assets.catalog import catalog_options, resolve_voice
        from dora_primespeech_mlx.engine import GPTSoVITSEngine, SynthesisConfig

        where = catalog_options(settings)  # PRIMESPEECH_VOICES_DIR, PRIMESPEECH_VOICE_UNKNOWN_KEYS
        try:
            spec = resolve_voice(settings.voice, settings.model_dir, **where)
        except VoiceNotInstalledError:
            spec = resolve_voice(settings.voice, settings.model_dir, require_installed=False, **where)
            if not (settings.auto_download and spec.source == "preset"):
                raise
            from dora_primespeech_mlx.assets.download import download_voice
            from dora_primespeech_mlx.engine.encoders import prepare_coreml

            progress(f"voice {spec.name} is not installed: downloading it into {settings.model_dir} "
                     "(PRIMESPEECH_AUTO_DOWNLOAD=false turns this off) ...")
            download_voice(spec.name, settings.model_dir, after_convert=prepare_coreml)
            spec = resolve_voice(settings.voice, settings.model_dir, **where)
        start = {k: v for k, v in (("language", settings.text_lang), ("prompt_lang", settings.prompt_lang),
                                   ("prompt_text", settings.prompt_text)) if v is not None}
        if start:
            spec = replace(spec, **start)
        config = SynthesisConfig().replace(**settings.sampling())
        progress(f"loading voice {spec.name} (device {settings.device}, encoders {settings.encoders}) ...")
        t0 = time.perf_counter()
        engine = GPTSoVITSEngine(config=config, progress=progress, settings=settings)  # its runtime: the settings'
        freeze_front_ends(spec.language if settings.warmup else None, progress,  # (the engine loads no model yet)
                          engine.text_data)
        engine.load_voice(spec)
        progress(f"voice {spec.name} loaded in {time.perf_counter() - t0:.1f} s")
        if settings.warmup:
            t0 = time.perf_counter()
            front_ends = engine.warmup()
            detail = ", ".join(f"{lang} {s:.1f} s" for lang, s in front_ends.items())
            progress(f"warm-up done in {time.perf_counter() - t0:.1f} s (text front ends: {detail})")
        return engine, spec

    return build


def freeze_front_ends(language: str | None, progress: Callable[[str], None], data: TextData) -> None:
    """Load the text front ends ``language`` needs (None: none now; ``data``: the engine's folders), then move
    every object alive into the collector's permanent generation (``gc.freeze``).

    Why: the front ends' dictionaries are ~600 000 Python lists that live as long as the process, and a full
    collection walks them all while holding the GIL (docs/languages.md, "Speed and first load"): every model load
    (``convert.load``), every voice eviction and Python's own occasional full collections would stall the input
    thread (``stats``, ``reset``, STOP) that long. Frozen objects are never collected as cycles, so this runs
    before any model is loaded (a GPT holds a reference cycle and must stay collectable when a voice is
    dropped); objects freed by reference counting are freed as usual."""
    if language is not None:
        from dora_primespeech_mlx.text.warmup import warm_up

        t0 = time.perf_counter()
        front_ends = warm_up(language, data=data)
        detail = ", ".join(f"{lang} {s:.1f} s" for lang, s in front_ends.items())
        progress(f"text front ends loaded in {time.perf_counter() - t0:.1f} s ({detail})")
    gc.collect()
    gc.freeze()


def start_failure(handler: MessageHandler) -> str | None:
    """None when the engine is ready, else the message to report (and the node exits with code 2)."""
    exc = handler.startup_error
    if exc is None:
        return None
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


def announce(handler: MessageHandler) -> None:
    handler.status("ready", voice=handler.voice.name, language=handler.voice.language,
                   streaming=handler.settings.streaming, message=f"ready, voice {handler.voice.name}")


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
    """Exit at once (code 1) after losing the daemon: nothing can be sent any more, and a worker inside MLX must
    not be torn down by the interpreter (see :func:`main`)."""
    try:
        sys.stderr.write(f"[primespeech] ERROR {reason}; exiting\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr was a pipe to the daemon
        pass
    os._exit(1)


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


class Terminated:
    """SIGTERM handling for the node form: answered like STOP, whatever the main thread is doing.

    The signal may reach any thread, and the main thread may sit inside dora's ``next()`` (Rust code, which runs
    no Python signal handler until an event arrives), so the Python handler does nothing itself: the signal
    module's C handler writes the signal's number to a pipe (``signal.set_wakeup_fd``) and a thread waiting on
    that pipe calls ``on_term`` once. Install from the main thread, after ``Node()`` (the last handler wins)."""

    def __init__(self, on_term: Callable[[], None]):
        self.event = threading.Event()
        self.at: float | None = None  # when it came (time.monotonic)
        self._on_term = on_term
        self._read, write = os.pipe()
        os.set_blocking(write, False)
        signal.signal(signal.SIGTERM, lambda signum, frame: None)
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        threading.Thread(target=self._watch, name="primespeech-sigterm", daemon=True).start()

    def _watch(self) -> None:
        while True:
            try:
                data = os.read(self._read, 64)
            except InterruptedError:
                continue
            if not data:
                return
            if signal.SIGTERM in data and not self.event.is_set():
                self.at = time.monotonic()
                self.event.set()
                self._on_term()


def stop_and_exit(handler: MessageHandler, reason: str, since: float) -> None:
    """The end of a SIGTERM when the worker sends (dora 1.x): answer every text as cancelled (the same path as
    STOP), give the worker STOP_GRACE_S to reach a cancellation point, and exit with code 0 without waiting for
    the main thread (it may be inside dora's ``next()``). With an outbox (dora 0.3.x) the main thread, which
    polls, does this itself once it sees ``Terminated.event``."""
    n = handler.stop()
    handler.parked.wait(STOP_GRACE_S)
    handler.log("INFO", f"{reason}: {n} text(s) answered as cancelled; exiting {time.monotonic() - since:.2f} s "
                        f"after the {reason}")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main() -> int:
    """Console script ``dora-primespeech-mlx``: run as a Dora node until the dataflow stops.

    Stopping: when the inputs close (the upstream nodes finished) the queued texts are spoken first; on a STOP event
    (``dora stop``, Ctrl-C) or a SIGTERM (dora's kill after its grace period, ``docker stop``, systemd) the text in
    flight and every queued one are answered as cancelled and the node exits at once with code 0.

    Daemon loss: dora 1.1 reports a daemon that died as one ERROR event ("fatal event stream error: daemon channel
    broken") and then blocks in ``next()`` for ever; the node exits with code 1 on that event, and, when a daemon
    spawned it (``DORA_NODE_CONFIG`` set), as soon as its parent process is gone (checked every ``PARENT_WATCH_S``,
    also while the models load). Nothing can be answered then: the daemon that would carry the answers is gone."""
    from dora import Node

    try:
        settings, bad = Settings.from_env(), None
    except ConfigError as exc:
        settings, bad = Settings(), exc
    use_reliable_zenoh(settings)  # dora 1.x drops small outputs behind large ones with Zenoh's defaults
    node = Node()  # outside a dataflow this raises RuntimeError, as every dora node does
    watch_parent(settings)
    if bad is not None:
        handler = MessageHandler(settings, lambda p: (None, None), DirectTransport(node.send_output))
        report_start_failure(handler, str(bad), str(bad))
        return 2
    direct = sends_from_worker(settings)
    transport = DirectTransport(node.send_output) if direct else OutboxTransport()
    handler = MessageHandler(settings, engine_factory(settings), transport)
    term = Terminated(lambda: stop_and_exit(handler, "SIGTERM", term.at) if direct else None)
    handler.start()

    def outbox_term() -> bool:  # (with direct sends the SIGTERM thread answers and ends the process itself)
        return not direct and term.event.is_set()

    while not handler.ready.wait(POLL_S) and not outbox_term():
        transport.flush(node.send_output)
    if outbox_term():  # while the voice loads
        handler.stop()
        transport.flush(node.send_output)
        os._exit(0)
    failure = start_failure(handler)
    if failure is not None:
        report_start_failure(handler, failure, str(handler.startup_error))
        transport.flush(node.send_output)
        return 2
    announce(handler)
    stopped, reason = None, "STOP"
    while True:
        transport.flush(node.send_output)
        event = node.next() if direct else node.next(timeout=POLL_S)
        if outbox_term():
            stopped, reason = term.at, "SIGTERM"
            break
        if event is None:
            break
        kind = event.get("type")
        if kind == "INPUT":
            handler.on_input(event.get("id"), event.get("value"), event.get("metadata"))
        elif kind == "STOP":
            stopped = time.monotonic()
            break
        elif (param := parameter_event(event)) is not None:  # dora param set / delete
            handler.on_parameter(*param)
        elif daemon_lost(event):
            leave_orphaned(f"dora reports the daemon connection lost ({str(event.get('error')).splitlines()[0]})")
        elif kind == "ERROR" and "timed out" not in str(event.get("error", "")).lower():
            handler.log("WARNING", f"dora error event: {str(event.get('error'))[:300]}")
    if stopped is None and not direct:
        while not handler.wait_idle(POLL_S) and not outbox_term():
            transport.flush(node.send_output)
        if outbox_term():  # a SIGTERM while the queued texts are spoken
            stopped, reason = term.at, "SIGTERM"
    if stopped is not None:
        n = handler.stop()  # answers everything at once; the engine is not waited for
    else:
        handler.finish()
    transport.flush(node.send_output)
    parked = handler.parked.wait(STOP_GRACE_S)
    if stopped is not None:
        handler.log("INFO", f"{reason}: {n} text(s) answered as cancelled; exiting "
                            f"{time.monotonic() - stopped:.2f} s after the {reason}")
        transport.flush(node.send_output)
    if not parked or stopped is not None:
        # The worker is still inside the engine (a long SoVITS step): a thread that used MLX aborts the process
        # when the interpreter tears it down, so leave without that teardown, after dora's own clean-up. After a
        # STOP or SIGTERM too: the teardown of the loaded models and front ends takes seconds on a busy machine.
        del node, transport, handler
        gc.collect()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


class Operator:
    """``operator: python:`` form. The runtime calls :meth:`on_event` for every event and holds the GIL between
    events (dora 1.1, verified), so the worker runs only while ``on_event`` runs: ``on_event`` waits until the
    worker is idle — each text is spoken inside the ``on_event`` of its input — unless the operator has a
    heartbeat input (any input other than text/control/reset, e.g. ``tick: dora/timer/millis/50``): then every
    event lends the worker ``SLICE_S`` and returns, so ``reset`` gets through during a long synthesis."""

    SLICE_S = 0.05

    def __init__(self):
        settings = Settings.from_env()  # a bad variable fails the operator at start, with the list
        self.transport = OutboxTransport()
        self.handler = MessageHandler(settings, engine_factory(settings), self.transport)
        self.handler.start()
        self.handler.ready.wait()  # the factory always sets it (also when it fails)
        failure = start_failure(self.handler)
        if failure is not None:
            raise RuntimeError(f"dora-primespeech-mlx {failure}") from self.handler.startup_error
        announce(self.handler)
        self._sliced = False

    def on_event(self, dora_event: dict, send_output) -> Any:
        from dora import DoraStatus

        kind, input_id = dora_event.get("type"), dora_event.get("id")
        status = DoraStatus.CONTINUE
        if kind == "INPUT" and input_id in ("text", "control", "reset"):
            self.handler.on_input(input_id, dora_event.get("value"), dora_event.get("metadata"))
        elif kind == "INPUT":
            self._sliced = True  # a heartbeat
        elif (param := parameter_event(dora_event)) is not None:  # dora param set / delete
            self.handler.on_parameter(*param)
        elif kind == "STOP":
            self._stop(send_output)
            status = DoraStatus.STOP
        elif kind == "INPUT_CLOSED" and input_id == "text":
            self._finish(send_output)  # nothing more to speak (a heartbeat input would keep it alive)
            status = DoraStatus.STOP
        if status == DoraStatus.CONTINUE:
            if self._sliced:
                self.handler.wait_idle(self.SLICE_S)
            else:
                while not self.handler.wait_idle(WATCH_S):
                    self.transport.flush(send_output)
        self.transport.flush(send_output)
        return status

    def _stop(self, send_output) -> None:
        """STOP: every text answered as cancelled at once; the process ends within about a second even when the
        worker is deep in a long engine step (see OPERATOR_DRAIN_S)."""
        t0 = time.monotonic()
        n = self.handler.stop()
        self.transport.flush(send_output)
        if self.handler.parked.wait(STOP_GRACE_S):
            return
        self.handler.log("INFO", f"STOP: {n} text(s) answered as cancelled; the worker is still inside the engine: "
                                 f"exiting {time.monotonic() - t0:.2f} s after the STOP")
        self.transport.flush(send_output)
        time.sleep(OPERATOR_DRAIN_S)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    def _finish(self, send_output) -> None:
        while not self.handler.wait_idle(WATCH_S):
            self.transport.flush(send_output)
        self.handler.finish()
        self.handler.parked.wait(STOP_GRACE_S)


if __name__ == "__main__":
    sys.exit(main())
