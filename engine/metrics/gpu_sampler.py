"""GPU-level utilization from NVML (pynvml, from nvidia-ml-py): per GPU, the fraction of time a
kernel ran ("SM util"), the fraction of time memory was read or written, memory used, and power.

Where there is no NVIDIA driver (a CPU box) the sampler has no GPUs and returns no samples; NVML
errors never escape it.
"""

import contextlib
import logging
import time

import pynvml

from fleetctl.store.records import GpuSample

log = logging.getLogger(__name__)


class GpuSampler:
    def __init__(self) -> None:
        self._handles: list[tuple[int, object]] = []
        self._nvml = False
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            log.debug("no NVML (%s): GPU samples disabled", exc)
            return
        self._nvml = True
        try:
            self._handles = [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())]
        except pynvml.NVMLError as exc:
            log.warning("NVML device enumeration failed (%s): GPU samples disabled", exc)
            self.close()

    @property
    def device_count(self) -> int:
        return len(self._handles)

    def sample(self, now: float | None = None) -> list[GpuSample]:
        """One sample per GPU that answered. NVML's utilization rates cover its own last sampling
        period (1/6 s to 1 s depending on the GPU), so call this about once a second."""
        now = time.time() if now is None else now
        samples = []
        for index, handle in self._handles:
            try:
                rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            except pynvml.NVMLError as exc:
                log.debug("NVML sample of GPU %d failed: %s", index, exc)
                continue
            try:
                power_w: float | None = pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0  # milliwatts
            except pynvml.NVMLError:
                power_w = None  # not every board reports power
            samples.append(GpuSample(
                ts=now,
                device_index=index,
                interval_s=1.0,
                sm_util=rates.gpu / 100.0,
                mem_util=rates.memory / 100.0,
                mem_used_bytes=int(memory.used),
                power_w=power_w,
            ))
        return samples

    def close(self) -> None:
        self._handles = []
        if not self._nvml:
            return
        self._nvml = False
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def driver_version() -> str | None:
    """The NVIDIA driver's version string, or None without a driver."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else version
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()
