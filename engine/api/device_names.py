"""Device names — `cpu`, `cpu:N` (a logical CPU slot), `cuda:N` and `cuda:N#S` (slot S of a GPU that several
workers share, each with its share of the memory), optionally on a named node of a Ray cluster (`node2/cuda:0`,
`node1/cpu:0`) — parsed in one place: how names are written, how a GPU named twice becomes slots, which names clash.
Whether a device exists here is `engine/core/local_devices.py`'s to say (a node's devices are the cluster's to
check: the Ray launcher does)."""

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleetctl.domain import DeviceKind, WorkerState
from fleetctl.errors import UserError

if TYPE_CHECKING:
    from fleetctl.engine.api.status import WorkerInfo

LIVE_STATES = (WorkerState.STARTING.value, WorkerState.RUNNING.value, WorkerState.DRAINING.value)  # hold a device

_NAME = re.compile(r"(?:([A-Za-z0-9][A-Za-z0-9_.-]*)/)?(cpu|cuda)(?::(\d+)(?:#(\d+))?)?")


class DeviceError(UserError):
    """A device name that is malformed or does not exist on this machine."""


@dataclass(frozen=True)
class DeviceName:
    kind: DeviceKind
    index: int
    node: str = ""  # a Ray cluster's node name; "" is this machine (or, in a Ray fleet, the driver's node)
    slot: int | None = None  # `cuda:N#S`: one of the workers sharing GPU N (None: the GPU is the worker's alone)

    def __str__(self) -> str:
        return f"{self.node}/{self.local}" if self.node else self.local

    @property
    def local(self) -> str:
        """The name without its node: what the worker on that node calls its device."""
        return self.physical if self.slot is None else f"{self.physical}#{self.slot}"

    @property
    def physical(self) -> str:
        """The device itself, without node or slot: what torch computes on (`cuda:0` for `cuda:0#1`)."""
        return f"{self.kind.value}:{self.index}"

    @property
    def gpu_key(self) -> tuple[str, int] | None:
        """Which GPU this is, slots of it included (None for a CPU slot)."""
        return None if self.kind is DeviceKind.CPU else (self.node, self.index)


def parse_device_name(name: str, *, indexed: bool = False) -> DeviceName:
    """`indexed` requires the `:N` (a fleet places one worker per numbered device)."""
    match = _NAME.fullmatch(name.strip())
    if not match or (indexed and match.group(3) is None):
        form = "cpu:N or cuda:N" if indexed else "cpu, cpu:N or cuda:N"
        if "/" in name:
            form = f"NODE/{form} (NODE: a Ray node's name, of letters, digits, '.', '_' and '-')"
        raise DeviceError(f"unknown device {name!r}: use {form}; cuda:N#S is slot S of a GPU workers share")
    kind, slot = DeviceKind(match.group(2)), match.group(4)
    if slot is not None and kind is DeviceKind.CPU:
        raise DeviceError(f"unknown device {name!r}: a CPU has no #slots (cpu:N are its slots already)")
    return DeviceName(kind, int(match.group(3) or 0), match.group(1) or "", None if slot is None else int(slot))


def gpu_slots(devices: Iterable[str]) -> tuple[str, ...]:
    """`devices` with a GPU named more than once (`cuda:0,cuda:0`) turned into its slots (`cuda:0#0,cuda:0#1`),
    in order; every other name as given."""
    names = [parse_device_name(d) for d in devices]
    repeats = Counter(n for n in names if n.kind is DeviceKind.CUDA and n.slot is None)
    taken: Counter[DeviceName] = Counter()
    slotted = []
    for name in names:
        if repeats[name] > 1:
            slotted.append(f"{name}#{taken[name]}")
            taken[name] += 1
        else:
            slotted.append(str(name))
    return tuple(slotted)


def memory_share(device: str, fleet_devices: Iterable[str]) -> float:
    """The share of its GPU's memory a worker on `device` sizes its KV pool by: 1 for a whole GPU (or a CPU
    slot), 1/S for one of the S slots the fleet names on that GPU."""
    name = parse_device_name(device)
    if name.slot is None:
        return 1.0
    slots = {peer.slot for peer in map(parse_device_name, fleet_devices)
             if peer.gpu_key == name.gpu_key and peer.slot is not None} | {name.slot}
    return 1.0 / len(slots)


def gpu_clash(device: str, others: Iterable[str]) -> str | None:
    """The first of `others` that cannot run beside `device`: the same name, or the same GPU named whole beside
    one of its slots (a slot sizes its memory as a share of a split GPU). None when they all fit."""
    name = parse_device_name(device)
    for other in others:
        peer = parse_device_name(other)
        whole_and_slot = name.gpu_key is not None and peer.gpu_key == name.gpu_key and \
            (peer.slot is None) != (name.slot is None)
        if peer == name or whole_and_slot:
            return other
    return None


def free_devices(workers: "list[WorkerInfo]", count: int = 6) -> list[str]:
    """Devices no live worker holds, of the kind the fleet uses (cuda when it has GPU workers): up to `count`
    on each node the fleet's workers are on (a Ray fleet's `node2/cpu:N`; "" is this machine)."""
    names = [parse_device_name(w.device, indexed=True) for w in workers]
    used = {str(name) for name, w in zip(names, workers, strict=True) if w.state in LIVE_STATES}
    kind = DeviceKind.CUDA if any(name.kind is DeviceKind.CUDA for name in names) else DeviceKind.CPU
    free = []
    for node in sorted({name.node for name in names}) or [""]:
        highest = max((name.index for name in names if name.kind is kind and name.node == node), default=-1)
        candidates = (str(DeviceName(kind, i, node)) for i in range(highest + 1 + count))
        free += [device for device in candidates if device not in used][:count]
    return free
