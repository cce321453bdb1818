"""KV handoff between worker processes: the producer publishes a buffer and a plain-data handle;
the consumer copies out of it and acknowledges (through the controller); only then is the buffer
released. The controller carries handles, never tensors.

CPU: a file in /dev/shm, memory-mapped by both sides. GPU: CUDA IPC (torch's own tensor sharing):
the producer keeps the device buffer alive until release.
"""

import os
import pickle
import time
import uuid
from pathlib import Path

import torch

from fleetctl.engine.worker.protocol import HandleKind, KVHandle
from fleetctl.engine.worker.shm_files import SHM_DIR, buffer_path


class HandoffError(RuntimeError):
    """The published KV is gone or unreadable (its producer died, or it was released)."""


class KVTransport:
    """One per worker process: publishes its own KV, fetches its peers'. Buffers are named after the
    fleet (`fleet_pid`: the controller, by default this process's parent) and this process (shm_files)."""

    def __init__(self, shm_dir: Path = SHM_DIR, fleet_pid: int | None = None) -> None:
        self._live: dict[str, torch.Tensor] = {}
        self.shm_dir = shm_dir
        self.fleet_pid = fleet_pid if fleet_pid is not None else os.getppid()

    def publish(self, kv: torch.Tensor) -> KVHandle:
        """kv: [layers, 2, n_blocks, block_size, Hkv, d] on this worker's device."""
        unique = uuid.uuid4().hex[:12]
        handle_id = f"{self.fleet_pid}-{os.getpid()}-{unique}"
        dtype = str(kv.dtype).removeprefix("torch.")
        nbytes = kv.numel() * kv.element_size()
        if kv.is_cuda:
            from torch.multiprocessing.reductions import reduce_tensor

            buffer = kv.contiguous()
            self._live[handle_id] = buffer
            recipe = pickle.dumps(reduce_tensor(buffer))
            return KVHandle(handle_id, HandleKind.CUDA_IPC, tuple(kv.shape), dtype, nbytes, "", recipe)
        path = buffer_path(self.shm_dir, self.fleet_pid, os.getpid(), unique)
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
        return KVHandle(handle_id, HandleKind.SHM, tuple(kv.shape), dtype, nbytes, str(path))

    def fetch(self, handle: KVHandle, device: torch.device) -> torch.Tensor:
        """A tensor on `device` holding the published KV (copied out of the shared buffer)."""
        dtype = getattr(torch, handle.dtype)
        try:
            if handle.kind is HandleKind.CUDA_IPC:
                rebuild, args = pickle.loads(handle.payload)
                return rebuild(*args).to(device, copy=True)
            numel = handle.nbytes // torch.empty((), dtype=dtype).element_size()
            mapped = torch.from_file(handle.location, shared=False, size=numel, dtype=dtype)
            return mapped.view(handle.shape).to(device, copy=True)
        except (OSError, RuntimeError) as exc:
            raise HandoffError(f"KV handoff {handle.handle_id} unreadable: {exc}") from None

    def release(self, handle: KVHandle) -> None:
        """Free the buffer. Safe to call twice, and from a process other than the producer (shm)."""
        self._live.pop(handle.handle_id, None)
        handle.unlink()


def timed_fetch(transport: KVTransport, handle: KVHandle, device: torch.device) -> tuple[torch.Tensor, float]:
    start = time.perf_counter()
    kv = transport.fetch(handle, device)
    if kv.is_cuda:
        torch.cuda.synchronize(kv.device)
    return kv, time.perf_counter() - start
