"""Placing worker processes. One interface: local processes now; other placements (Ray actors)
implement the same `Launcher` protocol."""

import multiprocessing as mp
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Protocol

from fleetctl.engine.worker import WorkerSpec, worker_main


@dataclass
class LaunchedWorker:
    spec: WorkerSpec
    conn: Connection
    process: BaseProcess

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.is_alive()

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
