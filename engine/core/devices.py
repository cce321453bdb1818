"""Devices as torch sees them: the torch.device of a device name, the dtype an engine computes in,
and the memory left for the KV pool."""

import os
import re
from functools import cache

import torch

from fleetctl.domain import DeviceKind
from fleetctl.engine.core.config import DEFAULT_CPU_KV_BYTES, GPU_KV_FRACTION, DType
from fleetctl.engine.core.device_names import check_device

TORCH_DTYPES = {DType.FLOAT32: torch.float32, DType.BFLOAT16: torch.bfloat16, DType.FLOAT16: torch.float16}


def torch_device(name: str) -> torch.device:
    """`cpu:N` is a logical CPU slot: it computes on the CPU (the fleet pins it to its cores)."""
    device = check_device(name)
    return torch.device("cpu") if device.kind is DeviceKind.CPU else torch.device("cuda", device.index)


@cache
def cpu_has_native_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return bool(re.search(r"\b(avx512_bf16|amx_bf16)\b", flags))


def resolve_dtype(dtype: DType, device: torch.device) -> torch.dtype:
    """`auto` is bf16 on GPUs and on CPUs with native bf16 (AVX512-BF16/AMX), fp32 otherwise."""
    if dtype is DType.AUTO:
        native = device.type == "cuda" or cpu_has_native_bf16()
        return torch.bfloat16 if native else torch.float32
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
