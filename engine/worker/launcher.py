"""Placing worker processes. One interface: local processes (here), Ray actors on a cluster's nodes
(`ray_launcher.py`), or the in-process fakes the controller's tests use all implement `Launcher`."""

import multiprocessing as mp
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Protocol

from fleetctl.engine.api.device_names import DeviceError
from fleetctl.engine.core.local_devices import check_device
from fleetctl.engine.worker.process import worker_main
from fleetctl.engine.worker.spec import WorkerSpec


class WorkerProcess(Protocol):
    """What the controller needs of a worker's process: multiprocessing's Process has all of it."""

    @property
    def pid(self) -> int | None: ...

    def is_alive(self) -> bool: ...

    def kill(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...


class Channel(Protocol):
    """Protocol messages both ways: a local pipe's `Connection`, or a Ray actor's socket (`ray_channel`)."""

    def send(self, obj: object) -> None: ...

    def recv(self) -> object: ...


@dataclass(frozen=True)
class ExitCause:
    """Why a worker's process ended, as its placement saw it (a Ray actor's death, its node's loss)."""

    reason: str
    node_lost: bool = False


@dataclass
class LaunchedWorker:
    spec: WorkerSpec
    conn: Channel | Connection
    process: WorkerProcess
    node: str = ""  # the Ray node it was placed on; "" for a process on this machine
    exit_cause: Callable[[], ExitCause | None] = lambda: None  # asked once its channel closed (may wait briefly)

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
    def check_device(self, device: str) -> None:
        """Raise DeviceError unless a worker can be placed on `device`."""

    def launch(self, spec: WorkerSpec) -> LaunchedWorker: ...


class LocalLauncher:
    """Each worker is a spawned child process talking over a duplex pipe."""

    def __init__(self) -> None:
        self._ctx = mp.get_context("spawn")

    @staticmethod
    def check_device(device: str) -> None:
        if check_device(device, indexed=True).node:
            raise DeviceError(f"{device} names a node of a Ray cluster: serve the fleet with --ray to use one")

    def launch(self, spec: WorkerSpec) -> LaunchedWorker:
        parent, child = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(target=worker_main, args=(spec, child), name=spec.worker_id, daemon=True)
        process.start()
        child.close()
        return LaunchedWorker(spec, parent, process)
