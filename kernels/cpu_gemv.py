"""Decode's matrix products on a CPU through this package's own kernel (`cpu_gemv.c`): a stream over the weight
at a few rows, where torch's GEMMs spend a decode step's time on blocking and reordering (see the C file).

The kernel is compiled once per machine at first use — `cc -O3 -march=native -fopenmp` into
`$FLEET_KERNEL_CACHE` (default `~/.cache/fleetctl/kernels`), under a name that hashes the source, the compiler
and the CPU's flags, so a home shared by two machines holds one build each — and loaded with ctypes (which
drops the GIL for the call). It links the OpenMP runtime torch already loaded, so both share one thread pool.
`make install` builds it; a machine without a C compiler is refused with the command that would fix it.
"""

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from enum import IntEnum
from functools import cache
from pathlib import Path

import torch

from fleetctl.errors import FleetctlError

SOURCE = Path(__file__).with_name("cpu_gemv.c")
K_MULTIPLE = 16  # the dense rows stream 16 inputs at a time; q4 blocks are 32
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")


class WeightFormat(IntEnum):
    """The layouts `gemv` streams (the C enum's values)."""

    F32 = 0
    BF16 = 1
    I8 = 2  # int8 codes, a scale per output row
    Q4 = 3  # 4-bit blocks of 32 inputs, a scale and a zero per group (cpu_gemv.c)


class KernelBuildError(FleetctlError):
    """The CPU kernel could not be compiled on this machine."""


def cache_dir() -> Path:
    return Path(os.environ.get("FLEET_KERNEL_CACHE") or "~/.cache/fleetctl/kernels").expanduser()


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            return next((line for line in info if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def _compiler() -> str:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise KernelBuildError("fleetctl's CPU kernels need a C compiler: install gcc (apt-get install gcc)")
    return compiler


def build() -> Path:
    """The shared library for this machine, compiled when it is not in the cache yet (atomically: workers that
    start together each compile to a temporary name and rename)."""
    compiler = _compiler()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256("|".join((SOURCE.read_text(), version, platform.machine(), _cpu_flags(), *FLAGS))
                         .encode()).hexdigest()[:16]
    target = cache_dir() / f"cpu_gemv-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        run = subprocess.run([compiler, *FLAGS, "-o", str(built), str(SOURCE)], capture_output=True, text=True)
        if run.returncode:
            raise KernelBuildError(f"compiling {SOURCE.name} failed:\n{run.stderr.strip()}")
        os.replace(built, target)
    return target


@cache
def _library() -> ctypes.CDLL:
    library = ctypes.CDLL(str(build()))
    library.gemv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                             ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    library.gemv.restype = ctypes.c_int
    return library


@cache
def max_rows() -> int:
    """The most rows of x one call takes (the kernel keeps each row's sums in registers)."""
    return int(_library().gemv_max_rows())


@cache
def available() -> bool:
    """Whether this machine has the kernel (built now if need be); without a compiler, torch's kernels compute
    and a warning says why, once."""
    try:
        _library()
    except (KernelBuildError, OSError) as error:
        warnings.warn(f"{error}; decode's matrix products fall back to torch's kernels", stacklevel=2)
        return False
    return True


def dense_format(dtype: torch.dtype) -> WeightFormat:
    return WeightFormat.BF16 if dtype == torch.bfloat16 else WeightFormat.F32


def takes(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `gemv` computes x [T, K] against weight (codes) of x's device and compute dtype: a CPU tensor in
    float32 or bfloat16, T within max_rows, K a multiple of K_MULTIPLE."""
    return (x.device.type == "cpu" and weight.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16)
            and x.dim() == 2 and x.shape[0] > 0 and x.shape[1] % K_MULTIPLE == 0
            and (weight.dtype == x.dtype or weight.dtype in (torch.int8, torch.uint8))
            and available() and x.shape[0] <= max_rows())


def gemv(x: torch.Tensor, weight_format: WeightFormat, weight: torch.Tensor, out_features: int,
         aux: torch.Tensor | None = None, group_size: int = 0) -> torch.Tensor:
    """x [T, K] @ Wᵀ -> [T, N]: straight into the kernel, or — while a dispatch mode watches (torch's FLOP counter,
    a profiler's, a tracer's) — as the op `torch.ops.fleetctl.gemv`, so that it sees an opaque op with its shapes
    (the op costs ~8 µs more a call, which a decode step's 121 calls would pay for nothing otherwise)."""
    if torch._C._len_torch_dispatch_stack():
        return torch.ops.fleetctl.gemv(x, int(weight_format), weight, out_features, aux, group_size)
    return _gemv(x, weight_format, weight, out_features, aux, group_size)


def _gemv(x: torch.Tensor, weight_format: WeightFormat, weight: torch.Tensor, out_features: int,
          aux: torch.Tensor | None, group_size: int) -> torch.Tensor:
    """x [T, K] @ Wᵀ -> [T, N] in x's dtype. weight: F32/BF16 [N, K], I8 [N, K] with aux = scales [N], Q4
    [N, K/2] uint8 with aux = scales and zeros [K/group, N, 2]; aux in x's dtype. Contiguous weight and aux,
    `takes(x, weight)` true."""
    x = x.contiguous()
    rows, in_features = x.shape
    y = torch.empty(rows, out_features, dtype=x.dtype)
    status = _library().gemv(int(weight_format), weight.data_ptr(), 0 if aux is None else aux.data_ptr(),
                             out_features, in_features, group_size, x.data_ptr(), int(x.dtype == torch.bfloat16),
                             rows, y.data_ptr(), torch.get_num_threads())
    if status:
        raise MemoryError("the CPU kernel could not allocate its scratch buffer")
    return y


_LIBRARY = torch.library.Library("fleetctl", "DEF")
_LIBRARY.define("gemv(Tensor x, int weight_format, Tensor weight, int out_features, Tensor? aux, int group_size) "
                "-> Tensor")
_LIBRARY.impl("gemv", lambda x, fmt, weight, n, aux, group: _gemv(x, WeightFormat(fmt), weight, n, aux, group), "CPU")


@torch.library.register_fake("fleetctl::gemv")
def _gemv_shape(x: torch.Tensor, weight_format: int, weight: torch.Tensor, out_features: int,
                aux: torch.Tensor | None, group_size: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], out_features)
