"""Measuring a device's peaks where no spec sheet applies (CPUs, unknown GPUs): the MFU and MBU
denominators, so they must be the best the device can do, measured quietly.

- FLOP/s: a square matmul in the model's dtype, grown until one call takes a while, best of runs.
- bytes/s: a streaming read of a large tensor in the model's dtype — a sum over it, and a one-row
  matrix-vector product (how decode streams its weights) — best of several runs of each, the higher
  of the two. The tensor is as large as the model's weights (within [8 MiB, 512 MiB]): a model whose
  weights fit in the CPU's cache is held to the cache's bandwidth, a larger one to DRAM's.
- Quietly: calibrations on one machine take an exclusive lock and model loads a shared one, so no
  calibration overlaps a sibling worker's calibration or load (the disturbance that once gave a
  peak 14× too low, and MBU above 100 %).
"""

import fcntl
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from fleetctl.engine.paths import fleet_home
from fleetctl.kernels.packed_linear import linear, pack

MIN_WORKING_SET = 8 << 20
MAX_WORKING_SET = 512 << 20
_READ_WIDTH = 4096  # columns of the streamed matrix


def working_set(weight_bytes: int) -> int:
    """The calibration tensor's size for a model of `weight_bytes`: the next power of two, clamped."""
    size = MIN_WORKING_SET
    while size < min(weight_bytes, MAX_WORKING_SET):
        size *= 2
    return size


@contextmanager
def machine_lock(exclusive: bool) -> Iterator[None]:
    """Exclusive for a calibration, shared for a model load: one machine-wide flock."""
    path = fleet_home() / "cache" / "calibration.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _best_rate(run: Callable[[], object], sync: Callable[[], None], work: float, deadline: float,
               min_runs: int = 3) -> float:
    """Best `work` per second over repeated runs: at least `min_runs`, then until the deadline."""
    best, runs = 0.0, 0
    while runs < min_runs or time.perf_counter() < deadline:
        start = time.perf_counter()
        run()
        sync()
        best = max(best, work / (time.perf_counter() - start))
        runs += 1
    return best


def calibrate(device: torch.device, dtype: torch.dtype, working_set_bytes: int,
              budget_s: float = 1.0) -> tuple[float, float]:
    """(FLOP/s, bytes/s) measured on `device` in `dtype`, in about `budget_s`."""
    start = time.perf_counter()
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    flops = _matmul_rate(device, dtype, sync, budget_s / 30, start + 0.5 * budget_s)
    element = torch.empty((), dtype=dtype).element_size()
    matrix = torch.full((working_set_bytes // (_READ_WIDTH * element), _READ_WIDTH), 0.001, dtype=dtype,
                        device=device)
    vector = torch.full((1, _READ_WIDTH), 0.5, dtype=dtype, device=device)
    nbytes = matrix.numel() * element
    summed = _best_rate(matrix.sum, sync, nbytes, start + 0.75 * budget_s)
    matrix = pack(matrix)  # streamed as the engine streams its weights (packed on a CPU)
    streamed = _best_rate(lambda: linear(vector, matrix), sync, nbytes, start + budget_s)
    return flops, max(summed, streamed)


def _matmul_rate(device: torch.device, dtype: torch.dtype, sync: Callable[[], None], call_s: float,
                 deadline: float) -> float:
    """FLOP/s of a square matmul, grown until one call takes `call_s` (bigger runs nearer peak)."""
    n, max_n = 512, 8192 if device.type == "cuda" else 2048
    while True:
        a = torch.full((n, n), 0.5, dtype=dtype, device=device)
        out = torch.empty_like(a)
        call = time.perf_counter()
        torch.mm(a, a, out=out)
        sync()
        if time.perf_counter() - call >= call_s or n >= max_n:
            break
        n *= 2
    return _best_rate(lambda: torch.mm(a, a, out=out), sync, 2.0 * n**3, deadline)
