"""A fleet worker as a Ray actor: it connects back to the controller's channel and runs the same worker
loop as a local process (`process.run_worker`), on the device Ray placed it on. Peers on other nodes pull
the KV it publishes through Ray's object store (`read_kv`, `RayPull`). The driver imports this module to
name the actor class: torch is imported only inside the actor."""

import dataclasses
import os

import numpy as np
import ray

from fleetctl.domain import DeviceKind
from fleetctl.engine.api.device_names import DeviceName, parse_device_name
from fleetctl.engine.worker.protocol import KVHandle
from fleetctl.engine.worker.ray_channel import connect
from fleetctl.engine.worker.ray_nodes import NAMESPACE
from fleetctl.engine.worker.spec import WorkerSpec

PULL_TIMEOUT_S = 60.0


class RayWorker:
    """`run` holds one of the actor's threads for the worker's life; `where` and `read_kv` answer beside it."""

    def __init__(self, name: str) -> None:
        self.name = name  # the actor's name in the fleet's namespace: peers find it by this to pull KV

    @staticmethod
    def where() -> tuple[str, int]:
        """(Ray node id, pid) of this actor's process."""
        return ray.get_runtime_context().get_node_id(), os.getpid()

    def run(self, spec: WorkerSpec, address: tuple[str, int], authkey: bytes) -> bool:
        """The worker's whole life; True when it exited on its own terms (Shutdown, stand-down)."""
        from fleetctl.engine.worker.kv_transport import KVTransport
        from fleetctl.engine.worker.process import run_worker

        spec = _on_this_node(spec)
        if spec.cores:
            os.sched_setaffinity(0, spec.cores)
        transport = KVTransport(spec.shm_dir, spec.fleet_pid, RayPull(self.where()[0], self.name))
        conn = connect(address, authkey)
        try:
            return run_worker(spec, conn, transport)
        finally:
            conn.close()

    @staticmethod
    def read_kv(location: str, nbytes: int) -> np.ndarray:
        """A buffer this actor published, for a peer on another node: Ray moves it through the object store."""
        return np.asarray(np.memmap(location, dtype=np.uint8, mode="r", shape=(nbytes,)))


def _on_this_node(spec: WorkerSpec) -> WorkerSpec:
    """The spec as this node sees it: Ray made the one GPU it assigned `cuda:0` here; cores this node
    does not have are dropped (the controller counted cores on its own machine)."""
    device = parse_device_name(spec.device)
    if device.kind is DeviceKind.CUDA:
        spec = dataclasses.replace(spec, device=str(DeviceName(DeviceKind.CUDA, 0, device.node)))
    cores = tuple(core for core in spec.cores if core in os.sched_getaffinity(0))
    return dataclasses.replace(spec, cores=cores)


class RayPull:
    """The `RemotePull` of a worker in a Ray fleet: asks the producer's actor for its buffer."""

    def __init__(self, node: str, owner: str) -> None:
        self.node = node
        self.owner = owner
        self._actors: dict[str, ray.actor.ActorHandle] = {}

    def pull(self, handle: KVHandle):  # -> torch.Tensor [nbytes] uint8 on the CPU
        import warnings

        import torch

        from fleetctl.engine.worker.kv_transport import HandoffError

        try:
            producer = self._actors.get(handle.owner) or ray.get_actor(handle.owner, namespace=NAMESPACE)
            self._actors[handle.owner] = producer
            data = ray.get(producer.read_kv.remote(handle.location, handle.nbytes), timeout=PULL_TIMEOUT_S)
        except (ray.exceptions.RayError, ValueError) as exc:  # ValueError: no actor by that name (it is gone)
            self._actors.pop(handle.owner, None)
            raise HandoffError(f"KV handoff {handle.handle_id} from {handle.owner} unreachable through Ray: "
                               f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
        with warnings.catch_warnings():  # the object store's copy is read-only; it is only read, then copied
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(data)
