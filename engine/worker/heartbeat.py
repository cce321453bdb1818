"""A worker's heartbeat. A thread sends a small message every `interval_s` — also while the loop runs a
long step, so a slow prefill is not mistaken for a hang — and falls silent once one step has run past
`step_timeout_s`: a hung step (a deadlock, a stall) then looks like a stopped or dead process, which
sends nothing at all. The controller kills a worker it has not heard from for a bounded time.

Waits that are not steps (a checkpoint's writer, a migration's hold) keep the heartbeat going: their
own operations bound them."""

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from fleetctl.engine.worker import protocol as m


class Heartbeat:
    def __init__(self, worker_id: str, send: Callable[[object], None], interval_s: float,
                 step_timeout_s: float) -> None:
        self.worker_id = worker_id
        self.interval_s = interval_s
        self.step_timeout_s = step_timeout_s
        self._send = send
        self._step_started: float | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="heartbeat")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    @contextmanager
    def step(self) -> Iterator[None]:
        """Around one engine step: the heartbeat stops if it runs past the step timeout."""
        self._step_started = time.monotonic()
        try:
            yield
        finally:
            self._step_started = None

    def hung(self) -> bool:
        started = self._step_started
        return started is not None and time.monotonic() - started > self.step_timeout_s

    def _beat(self) -> None:
        while not self._stopped.wait(self.interval_s):
            if self.hung():
                continue
            try:
                self._send(m.Heartbeat(self.worker_id))
            except (OSError, ValueError):  # the controller is gone
                return
