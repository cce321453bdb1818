"""Write new keys and values into a paged KV cache layer: torch reference and Triton kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fleetctl.kernels.triton_support import kernel, next_pow2

if TYPE_CHECKING:
    import triton.language as tl


def store_kv_ref(k: torch.Tensor, v: torch.Tensor, kv_layer: torch.Tensor, slots: torch.Tensor) -> None:
    """k, v: [T, Hkv, d]; kv_layer: [2, blocks, block_size, Hkv, d]; slots: [T] int64 flat slot ids
    (block * block_size + offset). Writes in place."""
    flat = kv_layer.view(2, -1, *kv_layer.shape[-2:])
    flat[0].index_copy_(0, slots, k)
    flat[1].index_copy_(0, slots, v)


@kernel
def _store_kv_kernel(
    k_ptr,  # [T, Hkv, d], last dim contiguous
    v_ptr,  # [T, Hkv, d], last dim contiguous
    cache_ptr,  # [2, blocks * block_size, Hkv, d] contiguous
    slots_ptr,  # [T] int64
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kv,  # elements between the K and the V half of the cache
    num_kv_heads,
    head_dim,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + tok).to(tl.int64)
    if slot >= 0:  # a negative slot marks a padding token: nothing to store
        heads = tl.arange(0, BLOCK_H)[:, None]
        dims = tl.arange(0, BLOCK_D)[None, :]
        mask = (heads < num_kv_heads) & (dims < head_dim)
        dst = cache_ptr + slot * num_kv_heads * head_dim + heads * head_dim + dims
        key = tl.load(k_ptr + tok * stride_kt + heads * stride_kh + dims, mask=mask)
        value = tl.load(v_ptr + tok * stride_vt + heads * stride_vh + dims, mask=mask)
        tl.store(dst, key, mask=mask)
        tl.store(dst + stride_kv, value, mask=mask)


def store_kv_triton(k: torch.Tensor, v: torch.Tensor, kv_layer: torch.Tensor, slots: torch.Tensor) -> None:
    """Same contract as store_kv_ref: k, v [T, Hkv, d] into kv_layer [2, blocks, bs, Hkv, d] at slots [T]."""
    if not kv_layer.is_contiguous():
        raise ValueError("store_kv_triton needs a contiguous kv_layer")
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    tokens, num_kv_heads, head_dim = k.shape
    if tokens:
        _store_kv_kernel[(tokens,)](
            k, v, kv_layer, slots,
            k.stride(0), k.stride(1), v.stride(0), v.stride(1), kv_layer.stride(0),
            num_kv_heads, head_dim,
            BLOCK_H=next_pow2(num_kv_heads), BLOCK_D=next_pow2(head_dim), num_warps=4,
        )  # fmt: skip
