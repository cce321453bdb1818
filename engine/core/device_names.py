"""Device names — `cpu`, `cpu:N` (a logical CPU slot) and `cuda:N`, optionally on a named node of a Ray
cluster (`node2/cuda:0`, `node1/cpu:0`) — parsed and checked in one place, without torch: the controller
validates devices before any worker process exists. A node's devices are the cluster's to check (the
Ray launcher does); a name without a node is this machine's.

The GPU count comes from NVML (the driver), narrowed by CUDA_VISIBLE_DEVICES as CUDA would."""

import os
import re
from dataclasses import dataclass
from functools import cache

import pynvml

from fleetctl.domain import DeviceKind

_NAME = re.compile(r"(?:([A-Za-z0-9][A-Za-z0-9_.-]*)/)?(cpu|cuda)(?::(\d+))?")


class DeviceError(ValueError):
    """A device name that is malformed or does not exist on this machine."""


@dataclass(frozen=True)
class DeviceName:
    kind: DeviceKind
    index: int
    node: str = ""  # a Ray cluster's node name; "" is this machine (or, in a Ray fleet, the driver's node)

    def __str__(self) -> str:
        return f"{self.node}/{self.local}" if self.node else self.local

    @property
    def local(self) -> str:
        """The name without its node: what the worker on that node calls its device."""
        return f"{self.kind.value}:{self.index}"


def parse_device_name(name: str, *, indexed: bool = False) -> DeviceName:
    """`indexed` requires the `:N` (a fleet places one worker per numbered device)."""
    match = _NAME.fullmatch(name.strip())
    if not match or (indexed and match.group(3) is None):
        form = "cpu:N or cuda:N" if indexed else "cpu, cpu:N or cuda:N"
        if "/" in name:
            form = f"NODE/{form} (NODE: a Ray node's name, of letters, digits, '.', '_' and '-')"
        raise DeviceError(f"unknown device {name!r}: use {form}")
    return DeviceName(DeviceKind(match.group(2)), int(match.group(3) or 0), match.group(1) or "")


def check_device(name: str, *, indexed: bool = False) -> DeviceName:
    """Parse `name` and make sure a CUDA device of that index exists here (a named node's are not ours to
    count: the Ray launcher checks them against the cluster)."""
    device = parse_device_name(name, indexed=indexed)
    if device.kind is DeviceKind.CUDA and not device.node and device.index >= gpu_count():
        raise DeviceError(f"device {device} does not exist: this machine has {gpu_count()} CUDA device(s)")
    return device


@cache
def gpu_count() -> int:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return 0
    try:
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError:
        count = 0
    finally:
        pynvml.nvmlShutdown()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return count
    # CUDA stops at the first entry that is not a valid device
    listed = 0
    for entry in visible.split(","):
        if not entry.strip() or entry.strip().startswith("-"):
            break
        listed += 1
    return min(count, listed)
