"""Counting the FLOPs of the model's linear layers with torch's FLOP counter, packed products and the CPU kernel's
included (the counter knows `mm` and `addmm`, not oneDNN's `_linear_pointwise` nor kernels/cpu_gemv's op).

Import it inside a test, not at a module's top: torch's FLOP counter imports triton, which tests/kernels
must switch to its interpreter first."""

import torch
from torch.utils.flop_counter import FlopCounterMode, register_flop_formula

from fleetctl.kernels import cpu_gemv  # noqa: F401  (defines torch.ops.fleetctl.gemv)

LINEAR_OPS = (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.mkldnn._linear_pointwise, torch.ops.fleetctl.gemv)


@register_flop_formula(torch.ops.mkldnn._linear_pointwise)
def _packed_linear_flops(x_shape: torch.Size, weight_shape: torch.Size, *args: object, **kwargs: object) -> int:
    rows = 1
    for size in x_shape[:-1]:
        rows *= size
    return 2 * rows * weight_shape[0] * weight_shape[1]


@register_flop_formula(torch.ops.fleetctl.gemv)
def _gemv_flops(x_shape: torch.Size, weight_format: int, weight_shape: torch.Size, out_features: int,
                *args: object, **kwargs: object) -> int:
    return 2 * x_shape[0] * x_shape[1] * out_features


def linear_flops(counter: FlopCounterMode) -> int:
    counts = counter.get_flop_counts()["Global"]
    return sum(counts.get(op, 0) for op in LINEAR_OPS)
