"""Backend selection for the kernels, and the lazy Triton import.

`FLEET_KERNELS` (read by `fleetctl.kernels.ops` when it is first imported) picks the backend:

- `auto` (default): Triton kernels for CUDA tensors when triton is installed, torch references
  for everything else (CPU tensors, or no triton).
- `torch`: torch references everywhere.
- `interpret`: Triton kernels for every tensor; CPU tensors run through Triton's interpreter.

Import order. Triton decides whether a function is compiled or interpreted when `triton.jit` wraps
it, from `TRITON_INTERPRET`; triton.language's own helpers (tl.sum, tl.max, ...) are wrapped when
`triton` is imported. So TRITON_INTERPRET=1 must be set before *anything* imports triton:
`fleetctl.kernels.ops` sets it on import when FLEET_KERNELS=interpret (`use_interpreter()`), and it
refuses when triton is already loaded. The kernels in this package are plain functions marked
`@kernel`, jitted on their first launch, so importing them never imports triton. Interpretation is
process-wide, for every Triton kernel in the process.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any, NamedTuple

import torch

from fleetctl.errors import FleetctlError, UserError

MODES = ("auto", "torch", "interpret")
_compiled_any = False  # a kernel was wrapped for the GPU compiler; interpretation can't start now
_launch_records: list[set[Launch]] = []  # the sets `recording_launches` fills, innermost last


def kernel_mode() -> str:
    mode = os.environ.get("FLEET_KERNELS", "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise UserError(f"FLEET_KERNELS must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


@cache
def triton_available() -> bool:
    """Whether triton can be imported (checked without importing it)."""
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # e.g. sys.modules["triton"] = None
        return False


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def use_interpreter() -> None:
    """Route every Triton kernel of this process through the interpreter (CPU tensors work)."""
    if interpreting():
        return
    if _compiled_any or "triton" in sys.modules:
        # triton.language's own helpers (tl.sum, tl.max, ...) were jitted for the compiler on import
        raise RuntimeError(
            "triton was imported before the interpreter was switched on: set FLEET_KERNELS=interpret "
            "(or TRITON_INTERPRET=1) in the environment of the process"
        )
    os.environ["TRITON_INTERPRET"] = "1"


def load_triton() -> Any:
    """Import triton (after switching the interpreter on when FLEET_KERNELS=interpret)."""
    if not triton_available():
        raise FleetctlError(
            "Triton kernels need the `triton` package (pip install triton; Linux only), "
            "or set FLEET_KERNELS=torch to use the torch references"
        )
    if kernel_mode() == "interpret":
        use_interpreter()
    import triton

    return triton


@cache
def sm_count(device_index: int) -> int:
    """Streaming multiprocessors of a CUDA device (sizes the split-K grid)."""
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


class Kernel:
    """A Triton kernel (or a helper that kernels call) handed to `triton.jit` on first launch:
    `_my_kernel[grid](*args)`.

    On the first launch every `@kernel` of the module is jitted; those that kernels call take the
    place of their `Kernel` in the module's globals, where Triton resolves calls between kernels (the
    ones launched from Python stay `Kernel`s, so that `recording_launches` sees every launch); the
    module's `tl` (imported there only for type checkers) is bound there too, for the compiler and the
    interpreter alike."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self._jitted: Any = None

    def jitted(self) -> Any:
        global _compiled_any
        if self._jitted is None:
            triton = load_triton()
            module_globals = self.fn.__globals__
            module_globals.setdefault("tl", triton.language)
            kernels = {name: value for name, value in module_globals.items() if isinstance(value, Kernel)}
            called = {name for value in kernels.values() for name in value.fn.__code__.co_names}
            for name, value in kernels.items():
                if value._jitted is None:
                    value._jitted = triton.jit(value.fn)
                if name in called:
                    module_globals[name] = value._jitted
            _compiled_any = _compiled_any or not interpreting()
        return self._jitted

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., Any]:
        launch = self.jitted()[grid]
        if not _launch_records:
            return launch

        def recorded(*args: Any, **options: Any) -> Any:
            for record in _launch_records:
                record.add(Launch(self.fn.__name__, specialisation(args, options)))
            return launch(*args, **options)

        return recorded


def kernel(fn: Callable[..., Any]) -> Kernel:
    return Kernel(fn)


class Launch(NamedTuple):
    """A kernel launched in one of the variants Triton compiles separately."""

    kernel: str
    key: tuple[str, ...]


def int_class(value: int) -> str:
    """What Triton specialises an int argument by: 1, a multiple of 16, 64-bit, or any other int."""
    if value == 1:
        return "1"
    if not -(2**31) <= value < 2**31:
        return "i64"
    return "x16" if value % 16 == 0 else "i32"


def specialisation(args: tuple[Any, ...], options: dict[str, Any]) -> tuple[str, ...]:
    """Triton's cache key for a launch, as far as it changes between steps: each tensor's dtype and 16-byte
    alignment, each int's class, and the constexprs and launch options by value."""

    def of(value: Any) -> str:
        if isinstance(value, torch.Tensor):
            return f"{value.dtype}{'/16' if value.data_ptr() % 16 == 0 else ''}"
        if isinstance(value, int) and not isinstance(value, bool):
            return int_class(value)
        return type(value).__name__

    return tuple(map(of, args)) + tuple(f"{name}={value}" for name, value in sorted(options.items()))


def first_of_each_class(limit: int) -> list[int]:
    """The smallest n in 1..limit of each `int_class`: one value per specialisation of an int argument."""
    firsts: dict[str, int] = {}
    for n in range(1, min(limit, 16) + 1):  # 1, 2 and 16: the 64-bit class is beyond any batch or table
        firsts.setdefault(int_class(n), n)
    return list(firsts.values())


@contextmanager
def recording_launches() -> Iterator[set[Launch]]:
    """Every kernel launch in the block, by specialisation (a warm-up's coverage, and what a step needs)."""
    record: set[Launch] = set()
    _launch_records.append(record)
    try:
        yield record
    finally:
        _launch_records.remove(record)


def dot_numerics(dtype: torch.dtype) -> tuple[bool, str]:
    """(UPCAST, PRECISION) for kernels with tl.dot: the interpreter has no 16-bit dot (it multiplies
    bfloat16 bit patterns), so upcast there; float32 dots stay exact ("ieee", not TF32)."""
    interpret = interpreting()
    return interpret and dtype != torch.float32, "ieee" if interpret or dtype == torch.float32 else "tf32"


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()
