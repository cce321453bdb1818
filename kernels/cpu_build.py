"""This package's C kernels (`cpu_gemv.c`, `cpu_rows.c`, `cpu_step.c`, sharing `cpu_simd.h` and `cpu_kernels.h`),
compiled into one library once per machine at first use — or by `make install` — and loaded with ctypes (which drops
the GIL for each call). One library, so the whole decode step (`cpu_step.c`) calls the other files' kernels directly.

`cc -O3 -march=native -fopenmp` into `$FLEET_KERNEL_CACHE` (default `~/.cache/fleetctl/kernels`), under a name that
hashes the source, the compiler and the CPU's flags, so a home shared by two machines holds one build each. The
libraries link the OpenMP runtime torch already loaded, so they share one thread pool with it. A machine without a
C compiler is told which one to install, and its products fall back to torch's kernels.
"""

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from functools import cache
from pathlib import Path

from fleetctl.errors import FleetctlError
from fleetctl.kernels import triton_support

FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fopenmp", "-shared", "-fPIC")  # no errno: lrintf inlines


class KernelBuildError(FleetctlError):
    """A C kernel could not be compiled on this machine."""


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


def sources() -> list[Path]:
    return sorted(Path(__file__).parent.glob("cpu_*.c"))


def build() -> Path:
    """The shared library of every `cpu_*.c` for this machine, compiled when it is not in the cache yet (atomically:
    workers that start together each compile to a temporary name and rename)."""
    compiler = _compiler()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    files = [*sources(), *sorted(Path(__file__).parent.glob("cpu_*.h"))]
    key = hashlib.sha256("|".join((*(f"{f.name}:{f.read_text()}" for f in files), version, platform.machine(),
                                   _cpu_flags(), *FLAGS)).encode()).hexdigest()[:16]
    target = cache_dir() / f"cpu_kernels-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        run = subprocess.run([compiler, *FLAGS, "-o", str(built), *map(str, sources()), "-lm"], capture_output=True,
                             text=True)
        if run.returncode:
            raise KernelBuildError(f"compiling the CPU kernels failed:\n{run.stderr.strip()}")
        os.replace(built, target)
    return target


@cache
def library() -> ctypes.CDLL | None:
    """This package's kernels loaded, or None: under FLEET_KERNELS=torch (the references everywhere), or — with a
    warning, once — where they cannot be built. A CPU engine loads them as it starts, so a worker reports ready with
    its kernels compiled rather than compiling them in its first step."""
    if triton_support.kernel_mode() == "torch":
        return None
    try:
        return ctypes.CDLL(str(build()))
    except (KernelBuildError, OSError) as error:
        warnings.warn(f"{error}; the CPU falls back to torch's kernels", stacklevel=2)
        return None
