"""What `--dtype auto` means, without torch (the controller resolves it for the whole fleet): bf16 on
devices that compute natively in bf16 — GPUs, and CPUs with AVX512-BF16 or AMX — fp32 otherwise.

Workers that hand KV to each other must compute in one dtype (a worker cannot adopt KV of another
dtype), so `auto` over several devices is bf16 only when every one of them is native."""

import re
from collections.abc import Iterable
from functools import cache

from fleetctl.domain import DeviceKind
from fleetctl.engine.api.device_names import DeviceName
from fleetctl.engine.core.engine_settings import DType


@cache
def cpu_has_native_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return bool(re.search(r"\b(avx512_bf16|amx_bf16)\b", flags))


def native_bf16(device: DeviceName) -> bool:
    """A CPU on another node of a Ray cluster is not this machine's to inspect: it counts as not native
    (fp32 computes everywhere)."""
    if device.kind is DeviceKind.CUDA:
        return True
    return not device.node and cpu_has_native_bf16()


def auto_dtype(devices: Iterable[DeviceName]) -> DType:
    """The one dtype `auto` means for workers on `devices`."""
    return DType.BFLOAT16 if all(native_bf16(device) for device in devices) else DType.FLOAT32
