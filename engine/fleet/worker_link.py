"""The controller's end of one worker process: a writer thread drains an outbox into the pipe, a
reader thread hands every message (and finally the process's exit) to the event loop, then reaps the
process (no zombie is left, whoever asked it to exit or none)."""

import asyncio
import itertools
import queue
import threading
from collections.abc import Callable

from fleetctl.engine.worker import protocol as m
from fleetctl.engine.worker.launcher import ExitCause, LaunchedWorker

_incarnations = itertools.count()
_CLOSED = object()  # wakes the writer thread of a link whose process is gone
REAP_TIMEOUT_S = 10.0  # a process whose pipe closed gets this long to exit before it is killed


class WorkerLink:
    def __init__(
        self,
        launched: LaunchedWorker,
        loop: asyncio.AbstractEventLoop,
        on_message: Callable[["WorkerLink", object], None],
        on_exit: Callable[["WorkerLink"], None],
    ) -> None:
        self.launched = launched
        self.worker_id = launched.spec.worker_id
        self.incarnation = next(_incarnations)  # a migrated worker keeps its id; links tell them apart
        self.ready: m.WorkerReady | None = None  # kept for a process that has not taken over yet
        self.last_error = ""  # the process's own words if it failed (WorkerFailed)
        self.closed = False  # the process's pipe is gone: messages to it are dropped, not queued
        self.exit_cause: ExitCause | None = None  # what its launcher knows of its end, once it ended
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._loop = loop
        self._on_message = on_message
        self._on_exit = on_exit
        threading.Thread(target=self._read, daemon=True, name=f"read-{self.worker_id}").start()
        threading.Thread(target=self._write, daemon=True, name=f"write-{self.worker_id}").start()

    @property
    def pid(self) -> int | None:
        return self.launched.pid

    def send(self, msg: object) -> None:
        if not self.closed:
            self._outbox.put(msg)

    @property
    def queued(self) -> int:
        """Messages waiting to be written to the process."""
        return self._outbox.qsize()

    def kill(self) -> None:
        self.launched.kill()

    def join(self, timeout: float) -> None:
        self.launched.join(timeout)

    def _read(self) -> None:
        while True:
            try:
                msg = self.launched.conn.recv()
            except (EOFError, OSError):
                break
            self._loop.call_soon_threadsafe(self._on_message, self, msg)
        self._close()
        self.exit_cause = self.launched.exit_cause()
        if self.exit_cause is not None:
            self.last_error = self.last_error or self.exit_cause.reason
        self._loop.call_soon_threadsafe(self._on_exit, self)
        self.launched.join(REAP_TIMEOUT_S)  # its pipe closed: it is exiting; reap it (killed if it lingers)

    def _write(self) -> None:
        while True:
            msg = self._outbox.get()
            if msg is _CLOSED:
                return
            try:
                self.launched.conn.send(msg)
            except (OSError, ValueError):
                self._close()
                return
            if isinstance(msg, m.Shutdown):
                return

    def _close(self) -> None:
        self.closed = True
        while not self._outbox.empty():
            self._outbox.get_nowait()
        self._outbox.put(_CLOSED)
