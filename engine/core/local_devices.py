"""Which devices this machine has: a device name checked against the GPUs here (NVML, narrowed by
CUDA_VISIBLE_DEVICES as CUDA would), without torch — the controller validates devices before any worker process
exists. The names themselves are the contract's (`engine/api/device_names.py`)."""

import os
from functools import cache

import pynvml

from fleetctl.domain import DeviceKind
from fleetctl.engine.api.device_names import DeviceError, DeviceName, parse_device_name


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
