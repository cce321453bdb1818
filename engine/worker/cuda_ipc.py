"""KV handoff buffers shared through CUDA IPC, and the reference accounting that frees them.

Torch's CUDA IPC counts, per export, one reference the consumer owes: the producer's memory is only
freed once that count is back to zero. A consumer pays it when the tensor it rebuilt dies; a consumer
that never fetched (abort, recompute, a consumer that died) never pays, and torch would keep the
buffer forever. So the producer keeps every export here until ReleaseKV/Abort and then pays what the
consumer did not.

What the producer learns from the consumer goes through a lease: a one-byte file in shared memory,
named like the shm buffers (so a killed fleet's leases are swept with them). The consumer marks it
once its rebuilt tensor is gone; the producer reads the mark through its own descriptor (the lease may
already be unlinked) and removes the lease on release, so that a fetch after release raises instead
of copying memory the allocator has reused.

Torch's own IPC calls sit behind `IpcBackend`: the real one needs two GPU processes; tests use a fake
that counts references the way torch does.
"""

import inspect
import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, cast

import torch

UNFETCHED, FETCHED = b"\0", b"\1"


class IpcBackend(Protocol):
    """Torch's CUDA IPC: exporting a buffer, opening it elsewhere, paying a reference back."""

    def export(self, buffer: torch.Tensor) -> tuple[bytes, object]:
        """(payload another process opens the buffer with, the reference a consumer owes for it)."""

    def open(self, payload: bytes) -> torch.Tensor:
        """Consumer side: the producer's buffer; the owed reference is paid when this tensor dies."""

    def pay(self, reference: object) -> None:
        """Producer side: pay the reference a consumer never paid."""


class TorchIpc:
    """The real backend: torch.multiprocessing's CUDA tensor sharing."""

    def export(self, buffer: torch.Tensor) -> tuple[bytes, object]:
        from torch.multiprocessing.reductions import reduce_tensor

        rebuild, args = reduce_tensor(buffer)
        named = inspect.signature(rebuild).bind(*args).arguments
        reference = (named["ref_counter_handle"], named["ref_counter_offset"], named["storage_device"])
        return pickle.dumps((rebuild, args)), reference

    def open(self, payload: bytes) -> torch.Tensor:
        rebuild, args = pickle.loads(payload)
        return rebuild(*args)

    def pay(self, reference: object) -> None:
        counter_handle, counter_offset, device = cast(tuple[bytes, int, int], reference)
        torch.UntypedStorage._release_ipc_counter(counter_handle, counter_offset, device=device)


@dataclass
class _Export:
    buffer: torch.Tensor  # [layers, 2, n_blocks, block_size, Hkv, d], contiguous: alive until release
    reference: object  # what a consumer owes torch for this export
    lease: Path
    lease_fd: int  # the producer's own descriptor: readable after the lease is unlinked


class CudaIpcExports:
    """The producer's side: every export it has not released yet; and the consumer's fetch."""

    def __init__(self, backend: IpcBackend | None = None) -> None:
        self.backend = backend or TorchIpc()
        self._exports: dict[str, _Export] = {}

    @property
    def held(self) -> int:
        """Exports this producer still keeps alive."""
        return len(self._exports)

    def publish(self, handle_id: str, kv: torch.Tensor, lease: Path) -> bytes:
        """kv: [layers, 2, n_blocks, block_size, Hkv, d] on this worker's device. The payload to hand over."""
        buffer = kv.contiguous()
        fd = os.open(lease, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.pwrite(fd, UNFETCHED, 0)
            payload, reference = self.backend.export(buffer)
        except BaseException:
            os.close(fd)
            lease.unlink(missing_ok=True)
            raise
        self._exports[handle_id] = _Export(buffer, reference, lease, fd)
        return payload

    def release(self, handle_id: str) -> None:
        """End the handoff, fetched or not; safe twice, and a no-op for another producer's export."""
        export = self._exports.pop(handle_id, None)
        if export is None:
            return
        export.lease.unlink(missing_ok=True)  # from here on a fetch raises
        try:
            if os.pread(export.lease_fd, 1, 0) != FETCHED:
                self.backend.pay(export.reference)
        finally:
            os.close(export.lease_fd)

    def fetch(self, payload: bytes, lease: Path, device: torch.device) -> torch.Tensor:
        """A copy on `device` of a buffer published by another process; OSError once it is released, or
        when it was fetched before."""
        fd = os.open(lease, os.O_RDWR)  # FileNotFoundError: released, or never published
        try:
            if os.pread(fd, 1, 0) == FETCHED:  # torch counts one consumer per export: a second would pay twice
                raise FileExistsError(f"{lease} was fetched already (a CUDA IPC export is opened once)")
            shared = self.backend.open(payload)
            kv = shared.to(device, copy=True)
            if kv.is_cuda:
                torch.cuda.synchronize(kv.device)
            del shared  # pays torch's reference
            os.pwrite(fd, FETCHED, 0)
            if os.fstat(fd).st_nlink == 0:
                raise FileNotFoundError(f"{lease} was released while it was being copied")
            return kv
        finally:
            os.close(fd)
