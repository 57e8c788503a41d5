"""The Dora node: a drop-in replacement for the old ``dora-primespeech`` node. Only the dora event loop lives here:
the node's logic is :class:`.dataflow.handler.MessageHandler` (independent of dora), its process — start, signals,
the ways out — :mod:`.dataflow.serve`, the engine's start :mod:`.engine.startup`.

Two ways to run it: ``path: dora-primespeech-mlx`` (console script :func:`main`), the usual form, or
``operator: {python: dora_primespeech_mlx/node.py, inputs: ..., outputs: ...}`` (class :class:`Operator`).
Only the Dora API subset shared by dora-rs 0.3.x and 1.x is used: ``Node()``, ``node.next()`` /
``node.next(timeout)``, ``event["type" | "id" | "value" | "metadata"]`` and ``send_output(id, pa.Array, dict)``.

Inputs: ``text`` (plain text, JSON payload, ``VOICE:`` prefixes; see :mod:`.dataflow.messages`), ``control``
(reset, stats, list_voices, change_voice:NAME, cleanup) and ``reset`` (any value: same as the control command).
Outputs: ``audio``, ``segment_complete``, ``status``, ``log`` (see the README and :mod:`.dataflow.handler`). How
it starts, stops and leaves when the daemon is lost: :mod:`.dataflow.serve` and docs/dataflow.md."""

from __future__ import annotations

import sys
import time
from typing import Any

# Absolute imports: the operator runtime loads this file by path, as a top-level module.
from dora_primespeech_mlx.dataflow import serve
from dora_primespeech_mlx.dataflow.handler import WATCH_S, MessageHandler
from dora_primespeech_mlx.dataflow.params import parameter_event
from dora_primespeech_mlx.dataflow.serve import Service, daemon_lost, engine_factory, start_failure, watch_parent
from dora_primespeech_mlx.dataflow.transport import OutboxTransport
from dora_primespeech_mlx.errors import ConfigError
from dora_primespeech_mlx.settings import Settings, use_reliable_zenoh

__all__ = ["Operator", "daemon_lost", "engine_factory", "main", "start_failure", "watch_parent"]


def main() -> int:
    """Console script ``dora-primespeech-mlx``: run as a Dora node until the dataflow stops.

    Events are read from the first moment, also while the worker loads the start voice. When the inputs close
    (the upstream nodes finished) the queued texts are spoken first; on a STOP event (``dora stop``, Ctrl-C on
    ``dora run``), a SIGTERM (dora's kill after its grace period, ``docker stop``, systemd) or a SIGINT, the text
    in flight and every queued one are answered as cancelled and the node exits within a second with code 0.
    dora 1.1 reports a daemon that died as one ERROR event and then blocks in ``next()`` for ever: the node exits
    with code 1 on that event, or as soon as its parent daemon is gone (:func:`.dataflow.serve.watch_parent`)."""
    from dora import Node

    try:
        settings, bad = Settings.from_env(), None
    except ConfigError as exc:  # reported on status once the node can send
        settings, bad = Settings(), exc
    use_reliable_zenoh(settings)  # dora 1.x drops small outputs behind large ones with Zenoh's defaults
    node = Node()  # outside a dataflow this raises RuntimeError, as every dora node does
    watch_parent(settings)
    direct = serve.sends_from_worker(settings)
    service = Service(settings, engine_factory(settings), node.send_output, direct)
    code = None if service.start(bad) else 2
    while code is None:
        service.flush()
        event = node.next() if direct else node.next(timeout=serve.POLL_S)
        kind = None if event is None else event.get("type")
        if kind == "INPUT":
            service.handler.on_input(event.get("id"), event.get("value"), event.get("metadata"))
        elif kind == "STOP":
            code = service.stop("STOP", time.monotonic())
        elif event is None:  # every input closed
            code = service.finish()
        elif (param := parameter_event(event)) is not None:  # dora param set / delete
            service.handler.on_parameter(*param)
        elif daemon_lost(event):
            serve.leave_orphaned(f"dora reports the daemon connection lost ({str(event['error']).splitlines()[0]})")
        elif kind == "ERROR" and "timed out" not in str(event.get("error", "")).lower():
            service.handler.log("WARNING", f"dora error event: {str(event.get('error'))[:300]}")
        if code is None and service.ending is not None:  # a signal or a failed start, asked of this thread (outbox)
            code = service.stop(*service.ending)
    service.detach()
    del node  # dora's own clean-up of the node, where nothing else holds it (an outbox: dora-rs 0.3.x)
    serve.leave(code)
    return code


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
        serve.announce(self.handler)
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
        worker is deep in a long engine step (see serve.OPERATOR_DRAIN_S)."""
        t0 = time.monotonic()
        n = self.handler.stop()
        self.transport.flush(send_output)
        if self.handler.parked.wait(serve.STOP_GRACE_S):
            return
        self.handler.log("INFO", f"STOP: {n} text(s) answered as cancelled; the worker is still inside the engine: "
                                 f"exiting {time.monotonic() - t0:.2f} s after the STOP")
        self.transport.flush(send_output)
        time.sleep(serve.OPERATOR_DRAIN_S)
        serve.leave(0)

    def _finish(self, send_output) -> None:
        while not self.handler.wait_idle(WATCH_S):
            self.transport.flush(send_output)
        self.handler.finish()
        self.handler.parked.wait(serve.STOP_GRACE_S)


if __name__ == "__main__":
    sys.exit(main())
