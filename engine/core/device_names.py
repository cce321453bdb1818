"""Device names — `cpu`, `cpu:N` (a logical CPU slot) and `cuda:N` — parsed and checked in one place,
without torch: the controller validates devices before any worker process exists.

The GPU count comes from NVML (the driver), narrowed by CUDA_VISIBLE_DEVICES as CUDA would."""

import os
import re
from dataclasses import dataclass
from functools import cache

import pynvml

from fleetctl.store.records import DeviceKind

_NAME = re.compile(r"(cpu|cuda)(?::(\d+))?")


class DeviceError(ValueError):
    """A device name that is malformed or does not exist on this machine."""


@dataclass(frozen=True)
class DeviceName:
    kind: DeviceKind
    index: int

    def __str__(self) -> str:
        return f"{self.kind.value}:{self.index}"


def parse_device_name(name: str, *, indexed: bool = False) -> DeviceName:
    """`indexed` requires the `:N` (a fleet places one worker per numbered device)."""
    match = _NAME.fullmatch(name.strip())
    if not match or (indexed and match.group(2) is None):
        form = "cpu:N or cuda:N" if indexed else "cpu, cpu:N or cuda:N"
        raise DeviceError(f"unknown device {name!r}: use {form}")
    return DeviceName(DeviceKind(match.group(1)), int(match.group(2) or 0))


def check_device(name: str, *, indexed: bool = False) -> DeviceName:
    """Parse `name` and make sure a CUDA device of that index exists here."""
    device = parse_device_name(name, indexed=indexed)
    if device.kind is DeviceKind.CUDA and device.index >= gpu_count():
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
