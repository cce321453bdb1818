"""Counting the FLOPs of the model's linear layers with torch's FLOP counter, packed products included
(kernels/packed_linear: the counter knows `mm` and `addmm`, not oneDNN's `_linear_pointwise`).

Import it inside a test, not at a module's top: torch's FLOP counter imports triton, which tests/kernels
must switch to its interpreter first."""

import torch
from torch.utils.flop_counter import FlopCounterMode, register_flop_formula

LINEAR_OPS = (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.mkldnn._linear_pointwise)


@register_flop_formula(torch.ops.mkldnn._linear_pointwise)
def _packed_linear_flops(x_shape: torch.Size, weight_shape: torch.Size, *args: object, **kwargs: object) -> int:
    rows = 1
    for size in x_shape[:-1]:
        rows *= size
    return 2 * rows * weight_shape[0] * weight_shape[1]


def linear_flops(counter: FlopCounterMode) -> int:
    counts = counter.get_flop_counts()["Global"]
    return sum(counts.get(op, 0) for op in LINEAR_OPS)
