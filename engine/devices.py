"""Device names (`cpu`, `cpu:N`, `cuda:N`), dtype choice, and memory available for the KV pool."""

import os
import re
from functools import cache

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_CHOICES = ("auto", *DTYPES)


class DeviceError(ValueError):
    """A device name that is malformed or does not exist on this machine."""


def parse_device(name: str) -> torch.device:
    """`cpu:N` is a logical CPU slot: it computes on the CPU (the fleet pins it to its cores)."""
    match = re.fullmatch(r"(cpu|cuda)(?::(\d+))?", name.strip())
    if not match:
        raise DeviceError(f"unknown device {name!r}: use cpu, cpu:N or cuda:N")
    kind, index = match.group(1), int(match.group(2) or 0)
    if kind == "cpu":
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if index >= count:
        raise DeviceError(f"device {name} does not exist: this machine has {count} CUDA device(s)")
    return torch.device("cuda", index)


@cache
def cpu_has_native_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return bool(re.search(r"\b(avx512_bf16|amx_bf16)\b", flags))


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto` is bf16 on GPUs and on CPUs with native bf16 (AVX512-BF16/AMX), fp32 otherwise."""
    if name == "auto":
        native = device.type == "cuda" or cpu_has_native_bf16()
        return torch.bfloat16 if native else torch.float32
    if name not in DTYPES:
        raise DeviceError(f"unknown dtype {name!r}: choose one of {', '.join(DTYPE_CHOICES)}")
    return DTYPES[name]


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
