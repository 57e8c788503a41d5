"""The worker's life: the ``primespeech-worker`` thread builds the engine and runs the queued jobs one at a time;
the ``primespeech-supervisor`` thread replaces a worker that died (answering the text it held); at interpreter
exit the worker is let park first. A worker thread never ends: a thread that used MLX aborts the process in its
thread-local teardown, so it parks (a daemon thread) and the process exits around it."""

from __future__ import annotations

import atexit
import threading
import time
import traceback
from collections.abc import Callable

from .cancellation import STOPPING
from .jobs import Job, JobQueue

WATCH_S = 0.5  # the supervisor looks at the worker this often
EXIT_WAIT_S = 5.0  # at interpreter exit, how long the worker may take to reach a cancellation point and park


class Worker:
    """``build()`` makes the engine (raises on failure, kept as :attr:`startup_error`), ``run(job)`` runs one job
    (the handler's: a text is spoken, a control answered); ``answers`` (:class:`.answers.Answers`) answers a text
    the worker could not run (``fail``), its outputs log and count. Events: :attr:`ready` (the engine was built, or
    failed), :attr:`stopping` (no job starts after it), :attr:`parked` (the worker has finished for good: the
    process may exit now)."""

    def __init__(self, jobs: JobQueue, build: Callable[[], None], run: Callable[[Job], None], answers):
        self.jobs, self.answers = jobs, answers
        self._build, self._run = build, run
        self.ready = threading.Event()
        self.startup_error: BaseException | None = None
        self.stopping = threading.Event()
        self.serving = threading.Event()  # set while a worker runs jobs; cleared when it ends or dies
        self.parked = threading.Event()

    def start(self) -> None:
        self._spawn(first=True)
        threading.Thread(target=self._supervise, name="primespeech-supervisor", daemon=True).start()
        atexit.register(self.park_at_exit)

    def park_at_exit(self) -> None:
        """At interpreter exit, before daemon threads are stopped: let the worker park (a thread that used MLX
        and wakes during finalization aborts the process, exit code 134). The text it speaks is cancelled (and
        answered as stopping, if the transport still sends); queued jobs are left."""
        if self.parked.is_set() or not self.serving.is_set():
            return
        self.stopping.set()
        self.jobs.close()
        current = self.jobs.current
        if current is not None and not current.answered:
            current.error, current.error_stage = STOPPING, "stop"
            current.cancel.set()
        self.parked.wait(EXIT_WAIT_S)

    def drained(self, stall_s: float) -> bool:
        """Wait until the queue is empty and nothing runs; False if no job finished for ``stall_s`` seconds."""
        last, since = self.jobs.pending(), time.monotonic()
        while not self.jobs.wait_idle(WATCH_S):
            now = self.jobs.pending()
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since > stall_s:
                return False
        return True

    def _spawn(self, first: bool = False) -> None:
        self.serving.set()
        threading.Thread(target=self._main, args=(first,), name="primespeech-worker", daemon=True).start()

    def _main(self, first: bool) -> None:
        try:
            if first:
                try:
                    self._build()
                except BaseException as exc:
                    self.startup_error = exc
                    return
                finally:
                    self.ready.set()
            while not self.stopping.is_set():
                job = self.jobs.get(WATCH_S)
                if job is None:
                    if self.jobs.closed:
                        break
                    continue
                try:
                    self._run_one(job)
                finally:
                    self.jobs.done()
        finally:
            self.serving.clear()
            if self.jobs.closed or self.stopping.is_set():
                self.parked.set()
            # Never let this thread end: a thread that used MLX aborts the process in its thread-local
            # teardown ("terminate called without an active exception", MLX 0.32 on Linux), so it parks
            # (a daemon thread) and the process exits around it.
            threading.Event().wait()

    def _run_one(self, job: Job) -> None:
        try:
            self._run(job)
        except BaseException as exc:  # answer it, whatever it was, and go on
            try:
                self.answers.out.log("ERROR", f"internal error: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            finally:
                if job.kind == "text":
                    self.answers.fail(job, f"internal error: {type(exc).__name__}: {exc}", "node")
            if not isinstance(exc, Exception):
                raise

    def _supervise(self) -> None:
        """Replace a worker that died (it parks instead of exiting: see ``_main``), answering its job."""
        self.ready.wait()
        while not self.stopping.wait(WATCH_S):
            if self.startup_error is not None or self.serving.is_set() or self.jobs.closed:
                continue
            current = self.jobs.current
            if current is not None and current.kind == "text":
                self.answers.fail(current, "internal error: the worker thread died", "node")
            self.jobs.done()
            self.answers.out.counts.add("worker_restarts")
            self.answers.out.log("ERROR", "the worker thread died; starting a new one")
            self._spawn()
