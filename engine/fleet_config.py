"""A fleet's shape: which workers, with which roles, on which devices (and CPU cores)."""

import os
import re
from dataclasses import dataclass
from pathlib import Path

from fleetctl.engine.devices import DeviceError
from fleetctl.engine.worker import WorkerSpec
from fleetctl.store.records import WorkerRole


class FleetConfigError(ValueError):
    """A fleet layout that cannot be built (bad counts, devices, or a device used twice)."""


@dataclass(frozen=True)
class FleetConfig:
    model_dir: Path
    prefill: int = 1
    decode: int = 1
    colocated: int = 0  # > 0: the baseline of N mixed workers, no handoff (prefill/decode ignored)
    devices: tuple[str, ...] = ()  # one per worker; () picks cuda:0.. or cpu:0..
    dtype: str = "auto"
    deterministic: bool = False
    max_queue: int = 256  # prompts waiting in the controller beyond this get "busy" (HTTP 429)
    num_kv_blocks: int | None = None  # per worker; None sizes from memory
    kv_memory_bytes: int | None = None
    max_num_seqs: int = 64
    ready_timeout_s: float = 300.0
    store_path: Path | None = None  # the SQLite metrics store (None: keep metrics in memory only)

    def __post_init__(self) -> None:
        if self.colocated < 0 or self.prefill < 0 or self.decode < 0:
            raise FleetConfigError("worker counts must be >= 0")
        if not self.colocated and (self.prefill < 1 or self.decode < 1):
            raise FleetConfigError("a disaggregated fleet needs --prefill >= 1 and --decode >= 1 (or --colocated N)")
        if self.devices and len(self.devices) != self.num_workers:
            raise FleetConfigError(f"{len(self.devices)} devices given for {self.num_workers} workers: give one each")
        if len(set(self.devices)) != len(self.devices):
            raise FleetConfigError("a device may host only one worker")
        for device in self.devices:
            if not re.fullmatch(r"(cpu|cuda):\d+", device):
                raise FleetConfigError(f"unknown device {device!r}: use cpu:N or cuda:N")

    @property
    def num_workers(self) -> int:
        return self.colocated or self.prefill + self.decode

    def roles(self) -> list[tuple[str, WorkerRole]]:
        if self.colocated:
            return [(f"mixed-{i}", WorkerRole.MIXED) for i in range(self.colocated)]
        return [(f"prefill-{i}", WorkerRole.PREFILL) for i in range(self.prefill)] + [
            (f"decode-{i}", WorkerRole.DECODE) for i in range(self.decode)
        ]


def default_devices(count: int) -> tuple[str, ...]:
    import torch

    gpus = torch.cuda.device_count()
    if gpus:
        if count > gpus:
            raise FleetConfigError(f"{count} workers need {count} devices; this machine has {gpus} GPU(s)")
        return tuple(f"cuda:{i}" for i in range(count))
    return tuple(f"cpu:{i}" for i in range(count))


def cpu_slot_cores(slot: int, num_slots: int, cores: list[int]) -> tuple[int, ...]:
    """The cores a logical cpu:N slot is pinned to: an equal share, or one shared core when there are
    more slots than cores."""
    per_slot = len(cores) // num_slots
    if per_slot == 0:
        return (cores[slot % len(cores)],)
    return tuple(cores[slot * per_slot : (slot + 1) * per_slot])


def worker_specs(config: FleetConfig) -> list[WorkerSpec]:
    devices = config.devices or default_devices(config.num_workers)
    cpu_slots = sorted(int(d.split(":")[1]) for d in devices if d.startswith("cpu:"))
    cores = sorted(os.sched_getaffinity(0))
    specs = []
    for (worker_id, role), device in zip(config.roles(), devices, strict=True):
        pinned: tuple[int, ...] = ()
        if device.startswith("cpu:"):
            pinned = cpu_slot_cores(cpu_slots.index(int(device.split(":")[1])), len(cpu_slots), cores)
        elif int(device.split(":")[1]) >= _gpu_count():
            raise DeviceError(f"device {device} does not exist: this machine has {_gpu_count()} CUDA device(s)")
        specs.append(WorkerSpec(
            worker_id=worker_id, role=role, device=device, model_dir=config.model_dir, dtype=config.dtype,
            deterministic=config.deterministic, cores=pinned, num_kv_blocks=config.num_kv_blocks,
            kv_memory_bytes=config.kv_memory_bytes, max_num_seqs=config.max_num_seqs,
            store_path=config.store_path,
        ))
    return specs


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count()
