"""This package's C kernels (`cpu_gemv.c`, `cpu_rows.c`, sharing `cpu_simd.h`), compiled once per machine at first
use — or by `make install` — and loaded with ctypes (which drops the GIL for each call).

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


def build(source: Path) -> Path:
    """The shared library of `source` for this machine, compiled when it is not in the cache yet (atomically:
    workers that start together each compile to a temporary name and rename)."""
    compiler = _compiler()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    headers = [header.read_text() for header in sorted(source.parent.glob("cpu_*.h"))]  # what the sources include
    key = hashlib.sha256("|".join((source.read_text(), *headers, version, platform.machine(), _cpu_flags(), *FLAGS))
                         .encode()).hexdigest()[:16]
    target = cache_dir() / f"{source.stem}-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        run = subprocess.run([compiler, *FLAGS, "-o", str(built), str(source), "-lm"], capture_output=True, text=True)
        if run.returncode:
            raise KernelBuildError(f"compiling {source.name} failed:\n{run.stderr.strip()}")
        os.replace(built, target)
    return target


@cache
def library(name: str) -> ctypes.CDLL | None:
    """This package's kernel `name` (`cpu_gemv`, `cpu_rows`) loaded, or None: under FLEET_KERNELS=torch (the
    references everywhere), or — with a warning, once — where it cannot be built."""
    if triton_support.kernel_mode() == "torch":
        return None
    try:
        return ctypes.CDLL(str(build(Path(__file__).with_name(f"{name}.c"))))
    except (KernelBuildError, OSError) as error:
        warnings.warn(f"{error}; the CPU falls back to torch's kernels", stacklevel=2)
        return None


def _sources() -> list[Path]:
    return sorted(Path(__file__).parent.glob("cpu_*.c"))


def build_all() -> list[Path]:
    """Every kernel built (make install)."""
    return [build(source) for source in _sources()]


def load_all() -> None:
    """Every kernel loaded (built first where the cache has none): a CPU engine calls it as it starts, so a worker
    reports ready with its kernels compiled rather than compiling them in its first step."""
    for source in _sources():
        library(source.stem)
