"""Decode's matrix products on a CPU through this package's own kernel (`cpu_gemv.c`, built by `cpu_build`): a
stream over the weight at a few rows, where torch's GEMMs spend a decode step's time on blocking and reordering
(see the C file).
"""

import ctypes
import sys
from dataclasses import dataclass, replace
from enum import IntEnum
from functools import cache

import torch

from fleetctl.kernels import cpu_build

K_MULTIPLE = 16  # the dense rows stream 16 inputs at a time; q4 blocks are 32


class WeightFormat(IntEnum):
    """The layouts `gemv` streams (the C enum's values)."""

    F32 = 0
    BF16 = 1
    I8 = 2  # int8 codes, a scale per output row or per block of 32 inputs
    Q4 = 3  # 4-bit blocks of 32 inputs, a scale and a zero per group (cpu_gemv.c)


@dataclass(frozen=True)
class Operands:
    """What the kernel reads of one weight matrix [N, K] (see `_gemv`)."""

    format: WeightFormat
    weight: torch.Tensor
    out_features: int
    aux: torch.Tensor | None = None
    group_size: int = 0  # q4: inputs per scale and zero; I8: 32 where a scale covers a block of 32 (else 0: a row)
    doubled_inputs: bool = False  # int8-split: the product over [x, x], 2K inputs
    row_limit: int = 64  # the most rows of x this weight goes through the kernel at (past it, torch's GEMM is faster)

    @property
    def unlimited(self) -> "Operands":
        """These operands through the kernel at every row count."""
        return replace(self, row_limit=sys.maxsize)


@cache
def _library() -> ctypes.CDLL | None:
    library = cpu_build.library()
    if library is not None:
        library.gemv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                 ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                 ctypes.c_void_p, ctypes.c_int]
        library.gemv.restype = ctypes.c_int
    return library


@cache
def max_rows() -> int:
    """The most rows of x one call takes (8 at a time in registers over each weight row); 0 where the kernel could
    not be built, so `takes` is false everywhere."""
    library = _library()
    return int(library.gemv_max_rows()) if library is not None else 0


def dense_format(dtype: torch.dtype) -> WeightFormat:
    return WeightFormat.BF16 if dtype == torch.bfloat16 else WeightFormat.F32


_COMPUTE_DTYPES = (torch.float32, torch.bfloat16)
_CODE_DTYPES = (torch.int8, torch.uint8)


def takes(x: torch.Tensor, operands: Operands) -> bool:
    """Whether `gemv` computes x [T, K] against these operands: x a CPU tensor in float32 or bfloat16, T within
    the weight's row limit (more than max_rows() go max_rows() a call), K a multiple of K_MULTIPLE, the weight of
    x's dtype or codes. (On every decode product: kept lean.)"""
    weight = operands.weight
    return (x.is_cpu and x.ndim == 2 and 0 < x.shape[0] <= operands.row_limit and max_rows() > 0
            and x.dtype in _COMPUTE_DTYPES and not x.shape[1] % K_MULTIPLE
            and (weight.dtype == x.dtype or weight.dtype in _CODE_DTYPES))


def gemv(x: torch.Tensor, operands: Operands) -> torch.Tensor:
    """x [T, K] @ Wᵀ -> [T, N]: straight into the kernel, or — while a dispatch mode watches (torch's FLOP counter,
    a profiler's, a tracer's) — as the op `torch.ops.fleetctl.gemv`, so that it sees an opaque op with its shapes
    (the op costs ~8 µs more a call, which a decode step's 121 calls would pay for nothing otherwise)."""
    weight_format, weight, out_features = operands.format, operands.weight, operands.out_features
    if torch._C._len_torch_dispatch_stack():
        return torch.ops.fleetctl.gemv(x, int(weight_format), weight, out_features, operands.aux, operands.group_size,
                                       operands.doubled_inputs)
    return _gemv(x, weight_format, weight, out_features, operands.aux, operands.group_size, operands.doubled_inputs)


def _gemv(x: torch.Tensor, weight_format: WeightFormat, weight: torch.Tensor, out_features: int,
          aux: torch.Tensor | None, group_size: int, doubled: bool) -> torch.Tensor:
    """x [T, K] @ Wᵀ -> [T, N] in x's dtype. weight: F32/BF16 [N, K], I8 [N, K] with aux = scales [N] (or
    [N, K/32] at group_size 32), Q4 [N, K/2] uint8 with aux = scales and zeros row by row, [N, K/group, 2]; aux in
    x's dtype; `doubled` (int8-split): the weight's inputs are [x, x], 2K of them. Contiguous weight and aux,
    `takes(x, weight)` true."""
    library = _library()
    if library is None:
        raise cpu_build.KernelBuildError("the CPU kernel is not built on this machine: check takes() first")
    x = x.contiguous()
    rows, in_features = x.shape
    y = x.new_empty((rows, out_features))
    step = max_rows()
    for start in range(0, rows, step):  # max_rows() a call: each call reads the weight once
        count = min(step, rows - start)
        status = library.gemv(weight_format, weight.data_ptr(), None if aux is None else aux.data_ptr(), out_features,
                              in_features * (2 if doubled else 1), group_size, doubled, x[start].data_ptr(),
                              x.dtype is torch.bfloat16, count, y[start].data_ptr(), torch.get_num_threads())
        if status:
            raise MemoryError("the CPU kernel could not allocate its scratch buffer")
    return y


_LIBRARY = torch.library.Library("fleetctl", "DEF")
_LIBRARY.define("gemv(Tensor x, int weight_format, Tensor weight, int out_features, Tensor? aux, int group_size, "
                "bool doubled) -> Tensor")
_LIBRARY.impl("gemv", lambda x, fmt, weight, n, aux, group, doubled: _gemv(x, WeightFormat(fmt), weight, n, aux, group,
                                                                           doubled), "CPU")


@torch.library.register_fake("fleetctl::gemv")
def _gemv_shape(x: torch.Tensor, weight_format: int, weight: torch.Tensor, out_features: int,
                aux: torch.Tensor | None, group_size: int, doubled: bool) -> torch.Tensor:
    return x.new_empty(x.shape[0], out_features)
