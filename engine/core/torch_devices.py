"""Devices as torch sees them: the torch.device of a device name, the process's current CUDA device,
the dtype an engine computes in, and the memory left for the KV pool."""

import os

import torch

from fleetctl.domain import DeviceKind
from fleetctl.engine.api.device_names import DeviceName, parse_device_name
from fleetctl.engine.core.auto_dtype import auto_dtype
from fleetctl.engine.core.engine_settings import DEFAULT_CPU_KV_BYTES, GPU_KV_FRACTION, DType
from fleetctl.engine.core.local_devices import check_device

TORCH_DTYPES = {DType.FLOAT32: torch.float32, DType.BFLOAT16: torch.bfloat16, DType.FLOAT16: torch.float16}


def torch_device(name: str) -> torch.device:
    """`cpu:N` is a logical CPU slot: it computes on the CPU (the fleet pins it to its cores)."""
    device = check_device(name)
    return torch.device("cpu") if device.kind is DeviceKind.CPU else torch.device("cuda", device.index)


def make_current(name: str) -> None:
    """Make the GPU of device name `name` the process's current CUDA device (nothing for a CPU). Triton
    launches a kernel on the current device, whichever device its tensors are on: a worker on cuda:1 that
    left cuda:0 current faults at its first kernel."""
    device = parse_device_name(name)
    if device.kind is DeviceKind.CUDA:
        torch.cuda.set_device(device.index)


def resolve_dtype(dtype: DType, device: torch.device) -> torch.dtype:
    """`auto` as for this device alone (`auto_dtype`); a fleet's workers get it resolved for all of them."""
    if dtype is DType.AUTO:
        kind = DeviceKind.CUDA if device.type == "cuda" else DeviceKind.CPU
        dtype = auto_dtype([DeviceName(kind, device.index or 0)])
    return TORCH_DTYPES[dtype]


def kv_budget(free: int, gpu_total: int | None, share: float = 1.0, cap: int | None = None) -> int:
    """Bytes for a KV pool: on a GPU (`gpu_total` given) GPU_KV_FRACTION of what is free, and at most of a slot's
    `share` of the whole GPU (its peers on the GPU may not have allocated yet); on a CPU a quarter of what is free,
    up to DEFAULT_CPU_KV_BYTES; never over `cap` (--kv-memory)."""
    if gpu_total is None:
        budget = min(free // 4, DEFAULT_CPU_KV_BYTES)
    else:
        budget = int(min(free, gpu_total * share) * GPU_KV_FRACTION)
    return min(budget, cap) if cap else budget


def total_memory(device: torch.device) -> int:
    """A GPU's memory in bytes, used or not (the whole a GPU slot takes its share of)."""
    return torch.cuda.get_device_properties(device).total_memory


def available_memory(device: torch.device) -> int:
    """Bytes free for new allocations on the device (MemAvailable on a CPU)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
