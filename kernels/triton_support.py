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
from collections.abc import Callable
from functools import cache
from typing import Any

import torch

MODES = ("auto", "torch", "interpret")
_compiled_any = False  # a kernel was wrapped for the GPU compiler; interpretation can't start now


class TritonUnavailableError(RuntimeError):
    """Triton kernels were asked for but the triton package is not importable."""


def kernel_mode() -> str:
    mode = os.environ.get("FLEET_KERNELS", "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"FLEET_KERNELS must be one of {', '.join(MODES)}, got {mode!r}")
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
        raise TritonUnavailableError(
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

    On the first launch every `@kernel` of the module is jitted and takes the place of its
    `Kernel` in the module's globals, where Triton resolves calls between kernels; the module's
    `tl` (imported there only for type checkers) is bound there too, for the compiler and the
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
            for name, value in list(module_globals.items()):
                if isinstance(value, Kernel):
                    if value._jitted is None:
                        value._jitted = triton.jit(value.fn)
                    module_globals[name] = value._jitted
            _compiled_any = _compiled_any or not interpreting()
        return self._jitted

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., Any]:
        return self.jitted()[grid]


def kernel(fn: Callable[..., Any]) -> Kernel:
    return Kernel(fn)


def dot_numerics(dtype: torch.dtype) -> tuple[bool, str]:
    """(UPCAST, PRECISION) for kernels with tl.dot: the interpreter has no 16-bit dot (it multiplies
    bfloat16 bit patterns), so upcast there; float32 dots stay exact ("ieee", not TF32)."""
    interpret = interpreting()
    return interpret and dtype != torch.float32, "ieee" if interpret or dtype == torch.float32 else "tf32"


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()
