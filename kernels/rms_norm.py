"""RMSNorm, optionally fused with the residual add that precedes it: torch reference and Triton kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from fleetctl.kernels.triton_support import kernel, next_pow2

if TYPE_CHECKING:
    import triton.language as tl


def rms_norm_ref(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual: [T, D]; weight: [D]. Returns (normed [T, D], new residual [T, D]).

    With a residual, the sum x + residual is the new residual stream and is what gets normalized.
    """
    if residual is not None:
        x = x + residual
    return F.rms_norm(x, (x.shape[-1],), weight, eps), x


@kernel
def _rms_norm_kernel(
    x_ptr,  # [T, D]
    res_ptr,  # [T, D] (unused without HAS_RESIDUAL)
    w_ptr,  # [D]
    out_ptr,  # [T, D]
    res_out_ptr,  # [T, D] x + residual (unused without HAS_RESIDUAL)
    stride_x,
    stride_res,
    stride_out,
    stride_res_out,
    n_cols,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0).to(tl.float32)
        # the residual stream is kept in the model dtype: round the sum before normalizing it
        summed = (x + r).to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_res_out + cols, summed, mask=mask)
        x = summed.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm_triton(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as rms_norm_ref. x, residual: [T, D]; weight: [D]."""
    dim = x.shape[-1]
    x2 = x.reshape(-1, dim)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    res2 = x2
    if residual is not None:
        res2 = residual.reshape(-1, dim)
        if res2.stride(-1) != 1:
            res2 = res2.contiguous()
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    summed = torch.empty_like(out) if residual is not None else x2
    rows = x2.shape[0]
    if rows:
        block = next_pow2(dim)
        warps = 4 if block <= 1024 else 8 if block <= 4096 else 16
        _rms_norm_kernel[(rows,)](
            x2, res2, weight, out, summed,
            x2.stride(0), res2.stride(0), out.stride(0), summed.stride(0),
            dim, eps,
            HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=warps,
        )  # fmt: skip
    new_residual = summed.view(x.shape) if residual is not None else x
    return out.view(x.shape), new_residual
