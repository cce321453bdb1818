"""KV handoff between two real processes through the real `KVTransport`: a producer publishes, a consumer
fetches, the test carries the handles between them as the controller does (tests/support/kv_peer.py).

On "cpu" that is the shared-memory path; on "cuda:0" torch's CUDA IPC (cuda_ipc.py), which only a GPU can
run: there the leak check is the producer's own allocator, back to its baseline once every export is released,
fetched or not (the fake backend of test_cuda_ipc_accounting.py only models it). Both paths: the consumer's
copy is the producer's tensor byte for byte, nothing published outlives its release, and a fetch after the
release is refused."""

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from support.kv_peer import Peer

from fleetctl.engine.worker.kv_transport import HandoffError
from fleetctl.engine.worker.protocol import HandleKind, KVHandle

DEVICES = ["cpu", pytest.param("cuda:0", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                    reason="needs CUDA"))]
# (seed, [layers, 2, n_blocks, block_size, Hkv, d], dtype); the consumer fetches every other one
EXPORTS = [(0, (3, 2, 5, 16, 2, 8), torch.float32), (1, (2, 2, 1, 16, 4, 64), torch.bfloat16),
           (2, (4, 2, 7, 16, 1, 16), torch.float16), (3, (1, 2, 33, 16, 8, 128), torch.bfloat16)]


@pytest.fixture(params=DEVICES)
def peers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Peer, Peer]]:
    """(producer, consumer): two processes on the same device, their buffers in `tmp_path`."""
    producer, consumer = Peer(request.param, tmp_path), Peer(request.param, tmp_path)
    try:
        yield producer, consumer
    finally:
        producer.close()
        consumer.close()


def test_consumer_copies_exactly_and_release_frees_everything(peers: tuple[Peer, Peer], tmp_path: Path) -> None:
    producer, consumer = peers
    cuda = producer.device.startswith("cuda")
    baseline = producer.call("held")
    assert baseline[0] == 0
    published: list[tuple[KVHandle, str]] = [producer.call("publish", *export) for export in EXPORTS]
    handles = [handle for handle, _ in published]
    assert {handle.kind for handle in handles} == {HandleKind.CUDA_IPC if cuda else HandleKind.SHM}
    for handle, checksum in published[::2]:
        assert consumer.call("fetch", handle) == checksum, handle
    assert len(list(tmp_path.iterdir())) == len(EXPORTS)  # a buffer (shm) or a lease (CUDA IPC) each
    held, allocated = producer.call("held")
    if cuda:  # the producer keeps every export's device memory, fetched or not
        assert held == len(EXPORTS) and allocated - baseline[1] >= sum(handle.nbytes for handle in handles)
    else:
        assert (held, allocated) == (0, 0)

    for handle in handles:  # fetched and un-fetched alike
        producer.call("release", handle)
    assert producer.call("held") == baseline  # on CUDA: every IPC reference paid, the memory freed
    assert list(tmp_path.iterdir()) == []

    for handle in handles:
        with pytest.raises(HandoffError, match="No such file"):  # refused because released, not "fetched already"
            consumer.call("fetch", handle)
