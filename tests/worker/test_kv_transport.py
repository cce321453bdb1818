"""KV handoff through shared memory on CPU: publish, fetch, release, and the plain-data handle."""

import os
import pickle
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fleetctl.engine.worker.kv_transport import HandoffError, KVTransport
from fleetctl.engine.worker.protocol import HandleKind, KVHandle
from fleetctl.engine.worker.shm_files import SHM_DIR, SHM_PREFIX, buffers, sweep_dead_fleets

CPU = torch.device("cpu")
SHAPE = (3, 2, 5, 16, 2, 8)  # [layers, 2, n_blocks, block_size, Hkv, d]


def random_kv(dtype: torch.dtype, seed: int = 0, shape: tuple[int, ...] = SHAPE) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32).to(dtype)


def own_buffers() -> set[Path]:
    return set(SHM_DIR.glob(f"{SHM_PREFIX}{os.getppid()}-{os.getpid()}-*"))


@pytest.fixture
def transport() -> Iterator[KVTransport]:
    """A transport whose buffers published during the test are removed afterwards, whatever happened."""
    before = own_buffers()
    yield KVTransport()
    for path in own_buffers() - before:
        path.unlink(missing_ok=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_publish_fetch_round_trips_exactly(transport: KVTransport, dtype: torch.dtype) -> None:
    kv = random_kv(dtype)
    handle = transport.publish(kv)
    assert handle.kind is HandleKind.SHM
    assert handle.shape == SHAPE
    assert handle.dtype == str(dtype).removeprefix("torch.")
    assert handle.nbytes == kv.numel() * kv.element_size()
    out = transport.fetch(handle, CPU)
    assert out.dtype == dtype
    assert out.shape == kv.shape
    assert torch.equal(out, kv)


def test_fetch_from_another_transport(transport: KVTransport) -> None:
    kv = random_kv(torch.bfloat16, seed=1)
    handle = transport.publish(kv)
    assert torch.equal(KVTransport().fetch(handle, CPU), kv)


def test_fetched_tensor_is_a_private_copy(transport: KVTransport) -> None:
    kv = random_kv(torch.float32, seed=2)
    handle = transport.publish(kv)
    first = transport.fetch(handle, CPU)
    first.zero_()
    assert torch.equal(transport.fetch(handle, CPU), kv)  # the shared buffer is untouched
    kv.zero_()
    assert not torch.equal(transport.fetch(handle, CPU), kv)  # publish copied, too


def test_non_contiguous_kv_round_trips(transport: KVTransport) -> None:
    base = random_kv(torch.float32, seed=3, shape=(3, 2, 16, 5, 2, 8))
    kv = base.transpose(2, 3)  # [3, 2, 5, 16, 2, 8], not contiguous
    assert not kv.is_contiguous()
    handle = transport.publish(kv)
    assert torch.equal(transport.fetch(handle, CPU), kv)


def test_shm_file_is_private_and_named(transport: KVTransport) -> None:
    handle = transport.publish(random_kv(torch.float32))
    path = Path(handle.location)
    assert path.parent == SHM_DIR
    assert path.name.startswith(f"{SHM_PREFIX}{os.getppid()}-{os.getpid()}-")  # the fleet's pid, then its own
    assert path.name == f"{SHM_PREFIX}{handle.handle_id}"
    mode = os.stat(path).st_mode
    assert stat.S_ISREG(mode)
    assert stat.S_IMODE(mode) == 0o600
    assert path.stat().st_size == handle.nbytes


def test_each_publish_gets_its_own_buffer(transport: KVTransport) -> None:
    a, b = random_kv(torch.float32, seed=4), random_kv(torch.float32, seed=5)
    ha, hb = transport.publish(a), transport.publish(b)
    assert ha.handle_id != hb.handle_id and ha.location != hb.location
    assert torch.equal(transport.fetch(ha, CPU), a)
    assert torch.equal(transport.fetch(hb, CPU), b)
    transport.release(ha)
    assert torch.equal(transport.fetch(hb, CPU), b)


def test_release_unlinks_and_is_safe_twice(transport: KVTransport) -> None:
    handle = transport.publish(random_kv(torch.float32))
    path = Path(handle.location)
    assert path.exists()
    transport.release(handle)
    assert not path.exists()
    transport.release(handle)
    assert not path.exists()


def test_fetch_after_release_raises_handoff_error(transport: KVTransport) -> None:
    handle = transport.publish(random_kv(torch.float32))
    transport.release(handle)
    with pytest.raises(HandoffError, match=handle.handle_id):
        transport.fetch(handle, CPU)


def test_handle_pickles_to_an_equal_value(transport: KVTransport) -> None:
    handle = transport.publish(random_kv(torch.bfloat16))
    copy = pickle.loads(pickle.dumps(handle))
    assert copy == handle
    assert copy is not handle
    assert copy.outlives_producer is True
    assert torch.equal(transport.fetch(copy, CPU), random_kv(torch.bfloat16))


def test_cuda_ipc_handle_does_not_outlive_its_producer() -> None:
    handle = KVHandle("x", HandleKind.CUDA_IPC, (1,), "float32", 4, "", b"recipe")
    assert handle.outlives_producer is False
    handle.unlink()  # device memory is the producer's: nothing to do, no error


def test_another_process_can_unlink_through_its_own_transport(transport: KVTransport) -> None:
    handle = transport.publish(random_kv(torch.float32))
    received = pickle.loads(pickle.dumps(handle))  # as the controller passes it on
    other = KVTransport()
    other.release(received)
    assert not Path(handle.location).exists()
    received.unlink()  # and again, directly
    with pytest.raises(HandoffError):
        transport.fetch(handle, CPU)


def test_consumer_fetches_after_the_producer_object_is_gone() -> None:
    kv = random_kv(torch.float32, seed=6)
    before = own_buffers()
    producer = KVTransport()
    handle = producer.publish(kv)
    assert own_buffers() - before == {Path(handle.location)}
    try:
        del producer
        consumer = KVTransport()
        assert torch.equal(consumer.fetch(handle, CPU), kv)
        consumer.release(handle)
        assert not Path(handle.location).exists()
    finally:
        Path(handle.location).unlink(missing_ok=True)


def test_truncated_buffer_is_a_handoff_error(transport: KVTransport) -> None:
    handle = transport.publish(random_kv(torch.float32))
    os.truncate(handle.location, handle.nbytes // 2)
    with pytest.raises(HandoffError):
        transport.fetch(handle, CPU)


def test_a_killed_fleets_buffers_are_swept_and_a_live_fleets_kept(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that no process has any more
    live = KVTransport(tmp_path, fleet_pid=os.getpid()).publish(random_kv(torch.float32))
    dead = KVTransport(tmp_path, fleet_pid=gone.pid).publish(random_kv(torch.float32))
    (tmp_path / "unrelated").write_bytes(b"x")
    assert {b.path for b in buffers(tmp_path)} == {Path(live.location), Path(dead.location)}
    assert sweep_dead_fleets(tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([Path(live.location).name, "unrelated"])
