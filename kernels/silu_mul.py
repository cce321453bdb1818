"""SwiGLU activation: silu(gate) * up over a fused [gate | up] projection. Torch reference and Triton kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from fleetctl.kernels.triton_support import kernel, next_pow2

if TYPE_CHECKING:
    import triton.language as tl


def silu_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: [T, 2I] -> [T, I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


@kernel
def _silu_mul_kernel(
    x_ptr,  # [T, 2I]
    out_ptr,  # [T, I]
    n_cols,  # I
    stride_x,
    stride_out,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    # round silu(gate) to the model dtype before the product, as the two torch ops do
    act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: [T, 2I] -> [T, I]."""
    width = gate_up.shape[-1]
    x = gate_up.reshape(-1, width)
    if x.stride(-1) != 1:
        x = x.contiguous()
    inner = width // 2
    out = torch.empty(x.shape[0], inner, dtype=gate_up.dtype, device=gate_up.device)
    if x.shape[0]:
        block = min(next_pow2(inner), 2048)
        grid = (x.shape[0], -(-inner // block))
        warps = 4 if block <= 1024 else 8
        _silu_mul_kernel[grid](x, out, inner, x.stride(0), out.stride(0), BLOCK=block, num_warps=warps)
    return out.view(*gate_up.shape[:-1], inner)
