"""KV handoff between worker processes: the producer publishes a buffer and a plain-data handle;
the consumer copies out of it and acknowledges (through the controller); only then is the buffer
released. The controller carries handles, never tensors.

CPU: a file in /dev/shm, memory-mapped by both sides. GPU: CUDA IPC (torch's own tensor sharing):
the producer keeps the device buffer, and pays torch's IPC reference back, until release (cuda_ipc.py).
In a Ray fleet a consumer on another node than the producer pulls the shm buffer through Ray's object
store (`RemotePull`, `worker/ray_actor.py`); same-node pairs keep the shared-memory path.
"""

import os
import time
import uuid
from pathlib import Path
from typing import Protocol

import torch

from fleetctl.engine.worker.cuda_ipc import CudaIpcExports
from fleetctl.engine.worker.protocol import HandleKind, KVHandle
from fleetctl.engine.worker.shm_files import SHM_DIR, buffer_path
from fleetctl.errors import FleetctlError

NO_GPU_CROSS_NODE = ("a GPU KV handoff between two nodes needs Ray's GPU direct transport (NCCL), which fleetctl "
                     "does not use yet (it could not be tested without GPUs): keep a Ray fleet's GPU workers on one "
                     "node; this request is recomputed on the decode worker")


class HandoffError(FleetctlError):
    """The published KV is gone or unreadable (its producer died, or it was released)."""


class RemotePull(Protocol):
    """How a worker in a Ray fleet reaches buffers published on other nodes."""

    node: str  # this worker's node id
    owner: str  # the name peers pull this worker's buffers through

    def pull(self, handle: KVHandle) -> torch.Tensor:
        """The published buffer's bytes, flat uint8 on the CPU; raises HandoffError."""


class KVTransport:
    """One per worker process: publishes its own KV, fetches its peers'. Buffers are named after the
    fleet (`fleet_pid`: the controller, by default this process's parent) and this process (shm_files)."""

    def __init__(self, shm_dir: Path = SHM_DIR, fleet_pid: int | None = None, remote: RemotePull | None = None,
                 cuda_ipc: CudaIpcExports | None = None) -> None:
        self.cuda_ipc = cuda_ipc or CudaIpcExports()
        self.shm_dir = shm_dir
        self.fleet_pid = fleet_pid if fleet_pid is not None else os.getppid()
        self.remote = remote
        self._where = {"node": remote.node, "owner": remote.owner} if remote else {}

    def publish(self, kv: torch.Tensor) -> KVHandle:
        """kv: [layers, 2, n_blocks, block_size, Hkv, d] on this worker's device."""
        unique = uuid.uuid4().hex[:12]
        handle_id = f"{self.fleet_pid}-{os.getpid()}-{unique}"
        dtype = str(kv.dtype).removeprefix("torch.")
        nbytes = kv.numel() * kv.element_size()
        path = buffer_path(self.shm_dir, self.fleet_pid, os.getpid(), unique)
        if kv.is_cuda:
            payload = self.cuda_ipc.publish(handle_id, kv, path)  # path: the export's lease
            return KVHandle(handle_id, HandleKind.CUDA_IPC, tuple(kv.shape), dtype, nbytes, str(path), payload,
                            **self._where)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # private from its first byte
        try:
            try:
                os.ftruncate(fd, nbytes)
            finally:
                os.close(fd)
            mapped = torch.from_file(str(path), shared=True, size=kv.numel(), dtype=kv.dtype)
            mapped.copy_(kv.reshape(-1))
        except BaseException:
            path.unlink(missing_ok=True)  # a buffer nobody got a handle for would never be removed
            raise
        return KVHandle(handle_id, HandleKind.SHM, tuple(kv.shape), dtype, nbytes, str(path), **self._where)

    def is_remote(self, handle: KVHandle) -> bool:
        """Published on another node of a Ray fleet."""
        return bool(handle.node) and self.remote is not None and handle.node != self.remote.node

    def fetch(self, handle: KVHandle, device: torch.device) -> torch.Tensor:
        """A tensor on `device` holding the published KV (copied out of the shared buffer)."""
        dtype = getattr(torch, handle.dtype)
        if self.is_remote(handle):
            return self._pull(handle).view(dtype).view(handle.shape).to(device, copy=True)
        try:
            if handle.kind is HandleKind.CUDA_IPC:
                return self.cuda_ipc.fetch(handle.payload, Path(handle.location), device)
            numel = handle.nbytes // torch.empty((), dtype=dtype).element_size()
            mapped = torch.from_file(handle.location, shared=False, size=numel, dtype=dtype)
            return mapped.view(handle.shape).to(device, copy=True)
        except (OSError, RuntimeError) as exc:
            raise HandoffError(f"KV handoff {handle.handle_id} unreadable: {exc}") from None

    def _pull(self, handle: KVHandle) -> torch.Tensor:
        """The bytes of a buffer published on another node (flat uint8, CPU)."""
        if handle.kind is HandleKind.CUDA_IPC:
            raise HandoffError(f"KV handoff {handle.handle_id}: {NO_GPU_CROSS_NODE}")
        assert self.remote is not None
        return self.remote.pull(handle)

    def release(self, handle: KVHandle) -> None:
        """Free the buffer. Safe to call twice, and from a process other than the producer (which, for CUDA IPC,
        only ends the lease: the device memory is freed by the producer's own release)."""
        self.cuda_ipc.release(handle.handle_id)
        handle.unlink()


def timed_fetch(transport: KVTransport, handle: KVHandle, device: torch.device) -> tuple[torch.Tensor, float]:
    start = time.perf_counter()
    kv = transport.fetch(handle, device)
    if kv.is_cuda:
        torch.cuda.synchronize(kv.device)
    return kv, time.perf_counter() - start
