"""Rotary position embedding (Hugging Face "rotate half" layout): torch reference and Triton kernel."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from fleetctl.kernels.triton_support import kernel, next_pow2

if TYPE_CHECKING:
    import triton.language as tl


@dataclass(frozen=True)
class RotaryTables:
    """A step's rotation laid out once for every layer's rotary_ref (per layer it was ~5 small ops)."""

    cos: torch.Tensor  # [T, 1, 1, d/2]
    signed_sin: torch.Tensor  # [T, 1, 2, d/2]: the halves' signs in rotate-half, -sin then +sin

    @classmethod
    def of(cls, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype) -> RotaryTables:
        """cos, sin: [T, d/2] for each token's position; the rotation computed in `dtype` (q's)."""
        sin = sin.to(dtype)[:, None, None, :]
        return cls(cos.to(dtype)[:, None, None, :], torch.cat((-sin, sin), dim=2))


def rotary_ref(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, tables: RotaryTables | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [T, H, d]; k: [T, Hkv, d]; cos, sin: [T, d/2] for each token's position, computed in q's
    dtype like Hugging Face's Llama (the Triton kernel computes in fp32); `tables`: RotaryTables.of them,
    when the caller laid them out once for every layer.

    Returns rotated (q, k), same shapes and dtype (views of one tensor: q and k are rotated together).
    """
    if tables is None:
        tables = RotaryTables.of(cos, sin, q.dtype)
    both = _rotate(torch.cat((q, k), dim=1), tables.cos, tables.signed_sin)  # [T, H + Hkv, d]
    return both[:, : q.shape[1]], both[:, q.shape[1] :]


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x1' = x1·cos - x2·sin, x2' = x2·cos + x1·sin: the halves as a size-2 axis, swapped by flip."""
    halves = x.unflatten(-1, (2, -1))  # [T, H, 2, d/2]
    return (halves * cos + halves.flip(2) * signed_sin).flatten(-2)


@kernel
def _rotary_kernel(
    q_ptr,  # [T, H, d], last dim contiguous; rotated in place
    k_ptr,  # [T, Hkv, d], likewise
    cos_ptr,  # [T, d/2], any float dtype (computed in fp32)
    sin_ptr,  # [T, d/2], likewise
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_cos,
    stride_sin,
    num_heads,
    num_kv_heads,
    half,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    dims = tl.arange(0, BLOCK_HALF)
    dmask = dims < half
    cos = tl.load(cos_ptr + tok * stride_cos + dims, mask=dmask, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(sin_ptr + tok * stride_sin + dims, mask=dmask, other=0.0).to(tl.float32)[None, :]

    heads = tl.arange(0, BLOCK_HQ)
    mask = (heads[:, None] < num_heads) & dmask[None, :]
    first = q_ptr + tok * stride_qt + heads[:, None] * stride_qh + dims[None, :]
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + half, mask=mask, other=0.0).to(tl.float32)
    tl.store(first, (x1 * cos - x2 * sin).to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(first + half, (x2 * cos + x1 * sin).to(q_ptr.dtype.element_ty), mask=mask)

    heads = tl.arange(0, BLOCK_HK)
    mask = (heads[:, None] < num_kv_heads) & dmask[None, :]
    first = k_ptr + tok * stride_kt + heads[:, None] * stride_kh + dims[None, :]
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + half, mask=mask, other=0.0).to(tl.float32)
    tl.store(first, (x1 * cos - x2 * sin).to(k_ptr.dtype.element_ty), mask=mask)
    tl.store(first + half, (x2 * cos + x1 * sin).to(k_ptr.dtype.element_ty), mask=mask)


def rotary_triton(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as rotary_ref, rotating q [T, H, d] and k [T, Hkv, d] in place (views of a fused
    qkv projection are fine) with cos, sin [T, d/2]; returns (q, k)."""
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    cos = cos if cos.stride(-1) == 1 else cos.contiguous()
    sin = sin if sin.stride(-1) == 1 else sin.contiguous()
    tokens, num_heads, head_dim = q.shape
    half = head_dim // 2
    if tokens:
        _rotary_kernel[(tokens,)](
            q, k, cos, sin,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0), sin.stride(0),
            num_heads, k.shape[1], half,
            BLOCK_HQ=next_pow2(num_heads), BLOCK_HK=next_pow2(k.shape[1]), BLOCK_HALF=next_pow2(half),
            num_warps=4,
        )  # fmt: skip
    return q, k
