"""CUDA IPC handoff accounting on CPU: the real producer/consumer bookkeeping (cuda_ipc.py, kv_transport.py)
over a fake IPC backend that counts the references a consumer owes exactly as torch does (one per export,
paid when the consumer's rebuilt tensor dies, or by the producer); only torch's CUDA calls are faked."""

import os
import pickle
import uuid
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fleetctl.engine.worker.cuda_ipc import CudaIpcExports
from fleetctl.engine.worker.kv_transport import HandoffError, KVTransport
from fleetctl.engine.worker.protocol import HandleKind, KVHandle
from fleetctl.engine.worker.shm_files import buffer_path

CPU = torch.device("cpu")
SHAPE = (2, 2, 3, 4, 1, 8)  # [layers, 2, n_blocks, block_size, Hkv, d]


class FakeIpc:
    """Torch's reference counting without a GPU: payloads name buffers in this process."""

    def __init__(self) -> None:
        self.buffers: dict[bytes, torch.Tensor] = {}
        self.owed: dict[bytes, int] = {}  # per export: references not yet paid (torch's ref counter)

    def export(self, buffer: torch.Tensor) -> tuple[bytes, object]:
        payload = uuid.uuid4().bytes
        self.buffers[payload], self.owed[payload] = buffer, 1
        return payload, payload

    def open(self, payload: bytes) -> torch.Tensor:
        shared = self.buffers[payload].view(self.buffers[payload].shape)
        weakref.finalize(shared, self.pay, payload)
        return shared

    def pay(self, reference: object) -> None:
        assert isinstance(reference, bytes)
        self.owed[reference] -= 1

    def unpaid(self) -> int:
        assert all(count >= 0 for count in self.owed.values()), f"a reference was paid twice: {self.owed}"
        return sum(self.owed.values())


@pytest.fixture
def ipc() -> FakeIpc:
    return FakeIpc()


@pytest.fixture
def producer(ipc: FakeIpc, tmp_path: Path) -> Iterator[KVTransport]:
    yield KVTransport(tmp_path, fleet_pid=os.getpid(), cuda_ipc=CudaIpcExports(ipc))


def publish(producer: KVTransport, kv: torch.Tensor) -> KVHandle:
    """What `KVTransport.publish` does for a CUDA tensor, on a CPU one."""
    handle_id = uuid.uuid4().hex[:12]
    lease = buffer_path(producer.shm_dir, producer.fleet_pid, os.getpid(), handle_id)
    payload = producer.cuda_ipc.publish(handle_id, kv, lease)
    return KVHandle(handle_id, HandleKind.CUDA_IPC, tuple(kv.shape), "float32", kv.numel() * 4, str(lease), payload)


def random_kv(seed: int) -> torch.Tensor:
    return torch.randn(SHAPE, generator=torch.Generator().manual_seed(seed))


def test_releasing_unfetched_exports_frees_every_reference(producer: KVTransport, ipc: FakeIpc) -> None:
    handles = [publish(producer, random_kv(seed)) for seed in range(5)]
    assert producer.cuda_ipc.held == 5 and ipc.unpaid() == 5
    for handle in handles:
        producer.release(handle)
    assert producer.cuda_ipc.held == 0
    assert ipc.unpaid() == 0
    assert list(producer.shm_dir.iterdir()) == []  # no lease left behind


def test_a_fetched_export_is_paid_once(producer: KVTransport, ipc: FakeIpc) -> None:
    kv = random_kv(1)
    handle = publish(producer, kv)
    consumer = KVTransport(producer.shm_dir, producer.fleet_pid, cuda_ipc=CudaIpcExports(ipc))
    assert torch.equal(consumer.fetch(pickle.loads(pickle.dumps(handle)), CPU), kv)
    assert ipc.unpaid() == 0  # the consumer paid when its rebuilt tensor died
    producer.release(handle)
    assert producer.cuda_ipc.held == 0 and ipc.unpaid() == 0  # and the producer did not pay again


def test_fetch_after_release_raises_and_copies_nothing(producer: KVTransport, ipc: FakeIpc) -> None:
    handle = publish(producer, random_kv(2))
    producer.release(handle)
    opened = []
    ipc.open = lambda payload: opened.append(payload)  # type: ignore[method-assign]
    with pytest.raises(HandoffError, match=handle.handle_id):
        KVTransport(producer.shm_dir, producer.fleet_pid, cuda_ipc=CudaIpcExports(ipc)).fetch(handle, CPU)
    assert opened == []


def test_a_second_fetch_raises_instead_of_paying_twice(producer: KVTransport, ipc: FakeIpc) -> None:
    handle = publish(producer, random_kv(7))
    producer.fetch(handle, CPU)
    with pytest.raises(HandoffError, match="fetched already"):
        producer.fetch(handle, CPU)
    producer.release(handle)
    assert producer.cuda_ipc.held == 0 and ipc.unpaid() == 0


def test_fetch_of_an_unknown_handle_raises(producer: KVTransport) -> None:
    lease = buffer_path(producer.shm_dir, producer.fleet_pid, os.getpid(), "never")
    handle = KVHandle("never", HandleKind.CUDA_IPC, SHAPE, "float32", 4, str(lease), b"recipe")
    with pytest.raises(HandoffError, match="never"):
        producer.fetch(handle, CPU)


def test_release_twice_is_harmless(producer: KVTransport, ipc: FakeIpc) -> None:
    handle = publish(producer, random_kv(3))
    producer.release(handle)
    producer.release(handle)
    assert producer.cuda_ipc.held == 0 and ipc.unpaid() == 0


def test_a_dead_consumer_does_not_keep_the_producers_buffer(producer: KVTransport, ipc: FakeIpc) -> None:
    handle = publish(producer, random_kv(4))
    consumer = KVTransport(producer.shm_dir, producer.fleet_pid, cuda_ipc=CudaIpcExports(ipc))
    consumer.release(pickle.loads(pickle.dumps(handle)))  # e.g. the controller cleaning up after it died
    del consumer
    assert producer.cuda_ipc.held == 1  # the device memory is the producer's to free
    producer.release(handle)
    assert producer.cuda_ipc.held == 0 and ipc.unpaid() == 0


def test_fetched_and_unfetched_exports_released_together(producer: KVTransport, ipc: FakeIpc) -> None:
    unfetched = publish(producer, random_kv(5))
    fetched = publish(producer, random_kv(6))
    producer.fetch(fetched, CPU)
    for handle in (fetched, unfetched):
        producer.release(handle)
    assert producer.cuda_ipc.held == 0 and ipc.unpaid() == 0
