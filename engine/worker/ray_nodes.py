"""A Ray cluster's nodes as a fleet names them, and how a worker is placed on one. Only a Ray fleet
(`serve --ray`) imports this module: the single-node path imports no Ray.

A node is named by a custom resource `fleetctl-node-<name>` (its operator starts it with, e.g.,
`ray start --resources '{"fleetctl-node-node2": 1, "fleetctl-cpu-slot": 4}'`); a node without one is
named by its IP address. `fleetctl-cpu-slot` is how many `cpu:N` workers the node takes: each CPU worker
holds one, so Ray, not the controller, decides whether a slot is free. A GPU worker holds `num_gpus=1`.
"""

import os
import socket
from dataclasses import dataclass

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from fleetctl.domain import DeviceKind
from fleetctl.engine.api.device_names import DeviceError, DeviceName

NODE_RESOURCE = "fleetctl-node-"
CPU_SLOT_RESOURCE = "fleetctl-cpu-slot"
LOCAL_NODE = "local"  # the name of the node `--ray auto` starts
NAMESPACE = "fleetctl"
CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class RayNode:
    name: str
    node_id: str
    alive: bool
    gpus: int
    cpu_slots: int
    ip: str


def connect(address: str) -> None:
    """`auto`: attach to the Ray instance running on this machine, or start one (its node named `local`,
    with one CPU slot per core, at least 8); otherwise join the cluster at `address`."""
    if ray.is_initialized():
        return
    options = {"namespace": NAMESPACE, "include_dashboard": False, "configure_logging": False}
    if address != "auto":
        _reachable(address)
        ray.init(address=address, **options)
        return
    try:
        ray.init(address="auto", **options)
    except ConnectionError:  # no instance running here: start one
        slots = max(8, os.cpu_count() or 1)
        ray.init(resources={f"{NODE_RESOURCE}{LOCAL_NODE}": 1, CPU_SLOT_RESOURCE: slots}, **options)


_names_seen: dict[str, str] = {}  # node id -> name: a dead node's entry has no resources left to name it by


def _reachable(address: str) -> None:
    """Fail in seconds, not minutes (Ray retries a cluster that is not there for a long time)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"a Ray address is HOST:PORT or auto, not {address!r}")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise ConnectionError(f"nothing answers at {address} ({exc.strerror or exc})") from None


def _named(entry: dict) -> RayNode:
    resources = entry.get("Resources", {})
    names = [key.removeprefix(NODE_RESOURCE) for key in resources if key.startswith(NODE_RESOURCE)]
    ip = entry.get("NodeManagerAddress", "")
    if names:
        _names_seen[entry["NodeID"]] = names[0]
    name = names[0] if names else _names_seen.get(entry["NodeID"], ip)
    return RayNode(name=name, node_id=entry["NodeID"], alive=bool(entry.get("Alive")),
                   gpus=int(resources.get("GPU", 0)), cpu_slots=int(resources.get(CPU_SLOT_RESOURCE, 0)), ip=ip)


def nodes() -> dict[str, RayNode]:
    """The cluster's nodes by name (a node that died stays listed, not alive, unless a live one took its name)."""
    found: dict[str, RayNode] = {}
    for node in map(_named, ray.nodes()):
        if node.name not in found or node.alive:
            found[node.name] = node
    return found


def node_by_id(node_id: str) -> RayNode | None:
    return next((node for node in map(_named, ray.nodes()) if node.node_id == node_id), None)


def driver_node() -> RayNode:
    here = node_by_id(ray.get_runtime_context().get_node_id())
    assert here is not None, "the driver's own node is not in the cluster's table"
    return here


def resolve(device: DeviceName) -> RayNode:
    """The live node `device` is on (no node: the driver's), checked to have that device."""
    known = nodes()
    node = known.get(device.node) if device.node else driver_node()
    if node is None:
        raise DeviceError(f"no Ray node named {device.node!r} (the cluster has: {', '.join(sorted(known))}); name a "
                          f"node with the resource {NODE_RESOURCE}<name>")
    if not node.alive:
        raise DeviceError(f"node {node.name} is lost (Ray reports it dead)")
    if device.kind is DeviceKind.CUDA and device.index >= node.gpus:
        raise DeviceError(f"{node.name}/{device.local} does not exist: node {node.name} has {node.gpus} GPU(s)")
    if device.kind is DeviceKind.CPU and device.index >= node.cpu_slots:
        raise DeviceError(f"{node.name}/{device.local} does not exist: node {node.name} offers {node.cpu_slots} CPU "
                          f"slot(s) (resource {CPU_SLOT_RESOURCE})")
    return node


def placement(device: DeviceName, node: RayNode) -> dict:
    """Ray actor options that put a worker for `device` on `node` and hold its device there."""
    held = {"num_gpus": 1} if device.kind is DeviceKind.CUDA else {"resources": {CPU_SLOT_RESOURCE: 1}}
    return {"num_cpus": 0, **held, "scheduling_strategy": NodeAffinitySchedulingStrategy(node.node_id, soft=False)}
