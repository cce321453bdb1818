"""KV handoff between two real processes through the real `KVTransport`, the test carrying the handles
between them as the controller does (tests/support/kv_peer.py).

On "cpu" that is the shared-memory path; on "cuda:0" torch's CUDA IPC (cuda_ipc.py), which only a GPU can run
(test_cuda_ipc_accounting.py models it with a fake backend). A producer's exports: the consumer's copy is the
producer's tensor byte for byte; once every export is released, fetched or not, nothing is left (on CUDA the
producer's allocator is back to its baseline: the leak check) and a fetch is refused. An engine handoff: a
prefill-only engine in one process, a decode engine in another, decode the same greedy tokens as one engine."""

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from support.kv_peer import Peer, engine

from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.worker import protocol as m
from fleetctl.engine.worker.kv_transport import HandoffError
from fleetctl.engine.worker.protocol import HandleKind, KVHandle

DEVICES = ["cpu", pytest.param("cuda:0", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                    reason="needs CUDA"))]
# (seed, [layers, 2, n_blocks, block_size, Hkv, d], dtype); the consumer fetches every other one
EXPORTS = [(0, (3, 2, 5, 16, 2, 8), torch.float32), (1, (2, 2, 1, 16, 4, 64), torch.bfloat16),
           (2, (4, 2, 7, 16, 1, 16), torch.float16), (3, (1, 2, 33, 16, 8, 128), torch.bfloat16)]

PROMPTS = ["The quick brown fox", "Once upon a time there was a small model that served", "def add(a, b):"]
PARAMS = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


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


def test_an_engine_handoff_between_processes_decodes_as_a_colocated_engine(peers: tuple[Peer, Peer],
                                                                           tiny_model_dir: Path,
                                                                           tmp_path: Path) -> None:
    """A prefill-only engine in one process, a decode engine in another, the KV between them through the
    transport: the greedy tokens are a single engine's, fp32 and deterministic (kv_peer.SETTINGS)."""
    prefill, decode = peers
    adopts: list[m.Adopt] = prefill.call("prefill", tiny_model_dir, PROMPTS, PARAMS)
    assert all(len(adopt.output_token_ids) == 1 for adopt in adopts)  # the prefill's token only
    tokens = decode.call("decode", tiny_model_dir, adopts)
    for adopt in adopts:
        prefill.call("finish_handoff", adopt.handle, adopt.request_id)
    assert list(tmp_path.iterdir()) == []

    colocated = engine(tiny_model_dir, prefill.device).generate(PROMPTS, PARAMS)
    assert tokens == {adopt.request_id: result.token_ids for adopt, result in zip(adopts, colocated, strict=True)}
