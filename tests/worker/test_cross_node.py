"""The pieces of a Ray fleet that need no cluster: a handle published on another node is pulled (not
memory-mapped) and rebuilt exactly; a GPU handle from another node fails with the NCCL message; the
socket channel an actor talks through; the local launcher refusing node names; CPU slots pinned per node.
The Ray path itself runs in tests/fleet/test_ray_fleet.py."""

import os
import socket
import threading
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection
from pathlib import Path

import pytest
import torch

from fleetctl.engine.api.device_names import DeviceError
from fleetctl.engine.fleet.fleet_config import pinned_cores
from fleetctl.engine.worker.kv_transport import NO_GPU_CROSS_NODE, HandoffError, KVTransport
from fleetctl.engine.worker.launcher import LocalLauncher
from fleetctl.engine.worker.protocol import HandleKind, KVHandle
from fleetctl.engine.worker.ray_channel import SocketChannel, connect

SHAPE = (2, 2, 3, 16, 2, 8)  # [layers, 2, n_blocks, block_size, Hkv, d]
KEY = b"k" * 32


class FilePull:
    """Stands in for Ray's object store between two nodes: the consumer gets the producer's bytes."""

    def __init__(self, node: str) -> None:
        self.node, self.owner, self.pulled = node, f"actor-on-{node}", []

    def pull(self, handle: KVHandle) -> torch.Tensor:
        self.pulled.append(handle.handle_id)
        return torch.frombuffer(bytearray(Path(handle.location).read_bytes()), dtype=torch.uint8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_buffer_from_another_node_is_pulled_and_rebuilt_exactly(tmp_path: Path, dtype: torch.dtype) -> None:
    producer, consumer = KVTransport(tmp_path, 1, FilePull("node-a")), KVTransport(tmp_path, 1, FilePull("node-b"))
    kv = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0)).to(dtype)
    handle = producer.publish(kv)
    assert (handle.node, handle.owner) == ("node-a", "actor-on-node-a")
    assert consumer.is_remote(handle) and not producer.is_remote(handle)
    fetched = consumer.fetch(handle, torch.device("cpu"))
    assert fetched.dtype == dtype and torch.equal(fetched, kv)
    assert consumer.remote.pulled == [handle.handle_id] and producer.remote.pulled == []
    assert torch.equal(producer.fetch(handle, torch.device("cpu")), kv)  # same node: shared memory, no pull
    producer.release(handle)


def test_a_gpu_handle_from_another_node_names_the_missing_transport(tmp_path: Path) -> None:
    handle = KVHandle("h1", HandleKind.CUDA_IPC, SHAPE, "float16", 1024, "", b"", node="node-a", owner="a")
    with pytest.raises(HandoffError) as exc:
        KVTransport(tmp_path, 1, FilePull("node-b")).fetch(handle, torch.device("cpu"))
    assert NO_GPU_CROSS_NODE in str(exc.value) and "NCCL" in str(exc.value)


def no_delay(conn: Connection) -> bool:
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        return bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


def test_the_socket_channel_carries_messages_both_ways() -> None:
    channel = SocketChannel("127.0.0.1", KEY)
    conn = connect(channel.address, KEY)
    channel.send({"to": "worker"})
    assert conn.recv() == {"to": "worker"}
    assert no_delay(conn) and no_delay(channel._connected())  # no Nagle delay on a message's second write
    big = bytes(range(256)) * 512  # past Connection's one-write size
    channel.send(big)
    assert conn.recv() == big
    conn.send(("to", "controller"))
    assert channel.recv() == ("to", "controller")
    conn.close()
    with pytest.raises(EOFError):
        channel.recv()


def test_closing_the_channel_wakes_a_blocked_reader() -> None:
    channel = SocketChannel("127.0.0.1", KEY)
    conn = Client(channel.address, authkey=KEY)
    ended: list[str] = []

    def read() -> None:
        try:
            channel.recv()
        except (EOFError, OSError) as exc:
            ended.append(type(exc).__name__)

    reader = threading.Thread(target=read)
    reader.start()
    channel.close()  # what the launcher does when Ray reports the actor dead
    reader.join(5)
    assert ended and not reader.is_alive()
    conn.close()


def test_a_channel_nobody_connected_to_ends_on_close() -> None:
    channel = SocketChannel("127.0.0.1", KEY)
    channel.close()
    with pytest.raises(EOFError):
        channel.recv()


def test_a_wrong_key_does_not_get_in() -> None:
    channel = SocketChannel("127.0.0.1", KEY)
    with pytest.raises(AuthenticationError):
        Client(channel.address, authkey=b"x" * 32)
    conn = Client(channel.address, authkey=KEY)  # the actor holding the key still gets in after it
    conn.send("hello")
    assert channel.recv() == "hello"
    conn.close()


def test_the_local_launcher_refuses_a_node_name() -> None:
    LocalLauncher.check_device("cpu:0")
    with pytest.raises(DeviceError, match="serve the fleet with --ray"):
        LocalLauncher.check_device("node2/cpu:0")


def test_cpu_slots_share_cores_only_with_slots_of_their_node(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
    fleet = {"node1/cpu:0", "node2/cpu:0", "node2/cpu:1"}
    assert pinned_cores("node1/cpu:0", fleet) == (0, 1, 2, 3)  # alone on node1
    assert pinned_cores("node2/cpu:0", fleet) == (0, 1)
    assert pinned_cores("node2/cpu:1", fleet) == (2, 3)
