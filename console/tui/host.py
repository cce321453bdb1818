"""This machine's side of the devices panel: GPU utilization, memory and power from NVML, and how
much CPU each local worker process uses (psutil). A console attached to another machine's fleet sees
its own host here, so the panel says which host it shows."""

import contextlib
import socket

import psutil

from fleetctl.engine.metrics.gpu_sampler import GpuSampler


class HostProbe:
    def __init__(self) -> None:
        self._gpus = GpuSampler()
        self._processes: dict[int, psutil.Process] = {}

    def sample(self, pids: list[int]) -> dict:
        """{"host", "gpus": [{"index", "sm_util", "mem_used_bytes", "power_w"}], "processes": {pid: cpu %}}
        (cpu % of one core since the previous sample; None the first time a pid is seen or if it is
        not on this machine)."""
        gpus = [{"index": s.device_index, "sm_util": s.sm_util, "mem_used_bytes": s.mem_used_bytes,
                 "power_w": s.power_w} for s in self._gpus.sample()]
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
        with contextlib.suppress(Exception):
            self._gpus.close()
