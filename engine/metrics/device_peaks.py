"""Peak FLOP/s and memory bytes/s of a device (the MFU/MBU denominators): from the spec table for
known GPUs, otherwise (CPUs, unknown GPUs) from a short quiet calibration (`calibration.py`). Either
way the result is cached in the store's `devices` table, keyed by the device identity and dtype, so
the next worker on a device starts without measuring; `fleetctl devices --recalibrate` measures again.

A CPU's identity holds its model name, the thread count the worker computes with (a `cpu:N` slot
pinned to 2 of 16 cores has a different peak from the whole socket) and the calibration's working set
(a model that fits in cache streams faster than one that does not):
`cpu:<model>:<threads>threads:<MiB>MiB`.
"""

import os
import platform
import time
from functools import cache
from pathlib import Path

import torch

from fleetctl.domain import DeviceKind, PeakSource
from fleetctl.engine.metrics.calibration import MAX_WORKING_SET, calibrate, machine_lock, working_set
from fleetctl.engine.metrics.gpu_sampler import driver_version
from fleetctl.engine.metrics.gpu_specs import find_gpu_spec
from fleetctl.store.db import open_db
from fleetctl.store.device_peak_cache import cached_device, save_device
from fleetctl.store.records import DeviceRecord


def spec_peaks(name: str, dtype: torch.dtype) -> tuple[float, float] | None:
    """(FLOP/s, bytes/s) from the spec table, or None for a GPU (or dtype) it does not know."""
    spec = find_gpu_spec(name)
    if spec is not None and dtype in (torch.bfloat16, torch.float16):
        return spec.tensor_flops, spec.bytes_per_s
    if spec is not None and dtype is torch.float32:
        return spec.fp32_flops, spec.bytes_per_s
    return None


@cache
def cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def device_identity(device: torch.device, working_set_bytes: int) -> tuple[str, str]:
    """(identity, name): ("cuda:NVIDIA H200", "NVIDIA H200") or ("cpu:<model>:<n>threads:<m>MiB", "<model>")."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return f"cuda:{name}", name
    name = cpu_model_name()
    return f"cpu:{name}:{torch.get_num_threads()}threads:{working_set_bytes >> 20}MiB", name


def device_peaks(device: torch.device, dtype: torch.dtype, weight_bytes: int,
                 store_path: Path | str | None = None, recalibrate: bool = False) -> DeviceRecord:
    """The device's peaks at `dtype` for a model of `weight_bytes`: from the store's cache when present
    (unless `recalibrate`), else from the spec table or a calibration, then cached (when a store is
    given). Call it in the process that computes on the device: a CPU identity counts its threads."""
    size = MAX_WORKING_SET * 2 if device.type == "cuda" else working_set(weight_bytes)
    identity, name = device_identity(device, size)
    dtype_name = str(dtype).removeprefix("torch.")
    db = open_db(store_path) if store_path is not None else None
    try:
        if db is not None and not recalibrate and (cached := cached_device(db, identity, dtype_name)) is not None:
            return cached
        on_gpu = device.type == "cuda"
        peaks = spec_peaks(name, dtype) if on_gpu else None
        if peaks is not None:
            source = PeakSource.SPEC_TABLE
        else:
            with machine_lock(exclusive=True):
                if db is not None and not recalibrate and (cached := cached_device(db, identity, dtype_name)):
                    return cached  # a sibling measured it while this worker waited for the lock
                peaks, source = calibrate(device, dtype, size), PeakSource.CALIBRATED
        record = DeviceRecord(
            identity=identity,
            dtype=dtype_name,
            kind=DeviceKind.CUDA if on_gpu else DeviceKind.CPU,
            name=name,
            driver=driver_version() if on_gpu else None,
            peak_flops=peaks[0],
            peak_bytes_per_s=peaks[1],
            how_measured=source,
            measured_at=time.time(),
        )
        if db is not None:
            save_device(db, record)
        return record
    finally:
        if db is not None:
            db.close()


def recalibrate_cpu(record: DeviceRecord, store_path: Path | str) -> DeviceRecord | None:
    """Measure a cached CPU identity again, in this process, at the thread count and working set it
    names (pinned to that many cores); None when the identity is another machine's CPU, or one without a
    working-set size (written before sizes were part of it: no worker looks it up any more)."""
    parts = record.identity.removeprefix("cpu:").rsplit(":", 2)
    if record.kind is not DeviceKind.CPU or len(parts) != 3 or not parts[2].endswith("MiB"):
        return None
    name, threads, size = parts
    if name != cpu_model_name():
        return None
    count = int(threads.removesuffix("threads"))
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:count])
    torch.set_num_threads(count)
    dtype = getattr(torch, record.dtype)
    return device_peaks(torch.device("cpu"), dtype, int(size.removesuffix("MiB")) << 20, store_path, recalibrate=True)
