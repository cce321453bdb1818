"""This machine's side of the devices panel: GPU utilization, memory and power from NVML, and how
much CPU each local worker process uses (psutil). A console attached to another machine's fleet sees
its own host here, so the panel says which host it shows. The GPU samples come from whatever the command that
started the console hands it (the engine's NVML sampler); without one the panel shows no GPU."""

import contextlib
import socket
from typing import Protocol

import psutil

from fleetctl.store.records import GpuSample


class GpuSamples(Protocol):
    def sample(self) -> list[GpuSample]: ...

    def close(self) -> None: ...


class HostProbe:
    def __init__(self, gpus: GpuSamples | None = None) -> None:
        self._gpus = gpus
        self._processes: dict[int, psutil.Process] = {}

    def sample(self, pids: list[int]) -> dict:
        """{"host", "gpus": [{"index", "sm_util", "mem_used_bytes", "power_w"}], "processes": {pid: cpu %}}
        (cpu % of one core since the previous sample; None the first time a pid is seen or if it is
        not on this machine)."""
        samples = self._gpus.sample() if self._gpus is not None else []
        gpus = [{"index": s.device_index, "sm_util": s.sm_util, "mem_used_bytes": s.mem_used_bytes,
                 "power_w": s.power_w} for s in samples]
        return {"host": socket.gethostname(), "gpus": gpus, "processes": {pid: self._cpu(pid) for pid in pids}}

    def _cpu(self, pid: int) -> float | None:
        process = self._processes.get(pid)
        try:
            if process is None:
                self._processes[pid] = psutil.Process(pid)
                self._processes[pid].cpu_percent(None)  # primes the counter
                return None
            return process.cpu_percent(None)
        except psutil.Error:
            self._processes.pop(pid, None)
            return None

    def close(self) -> None:
        if self._gpus is not None:
            with contextlib.suppress(Exception):
                self._gpus.close()
