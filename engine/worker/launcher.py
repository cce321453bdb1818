"""Placing worker processes. One interface: local processes now; other placements (Ray actors, or
the in-process fakes the controller's tests use) implement the same `Launcher` protocol."""

import multiprocessing as mp
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Protocol

from fleetctl.engine.worker.process import worker_main
from fleetctl.engine.worker.spec import WorkerSpec


class WorkerProcess(Protocol):
    """What the controller needs of a worker's process: multiprocessing's Process has all of it."""

    @property
    def pid(self) -> int | None: ...

    def is_alive(self) -> bool: ...

    def kill(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...


@dataclass
class LaunchedWorker:
    spec: WorkerSpec
    conn: Connection  # duplex: protocol messages both ways
    process: WorkerProcess

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()

    def join(self, timeout: float) -> None:
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(1.0)


class Launcher(Protocol):
    def launch(self, spec: WorkerSpec) -> LaunchedWorker: ...


class LocalLauncher:
    """Each worker is a spawned child process talking over a duplex pipe."""

    def __init__(self) -> None:
        self._ctx = mp.get_context("spawn")

    def launch(self, spec: WorkerSpec) -> LaunchedWorker:
        parent, child = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(target=worker_main, args=(spec, child), name=spec.worker_id, daemon=True)
        process.start()
        child.close()
        return LaunchedWorker(spec, parent, process)
