"""Write new keys and values into a paged KV cache layer: torch reference and Triton kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fleetctl.kernels import kv_quant
from fleetctl.kernels.triton_support import kernel, next_pow2

if TYPE_CHECKING:
    import triton.language as tl


def store_kv_ref(k: torch.Tensor, v: torch.Tensor, kv_layer: torch.Tensor, slots: torch.Tensor) -> None:
    """k, v: [T, Hkv, d]; kv_layer: [2, blocks, block_size, Hkv, d] (an int8 pool: rows of d +
    kv_quant.SCALE_BYTES, quantized here); slots: [T] int64 flat slot ids (block * block_size + offset). Writes in
    place."""
    if kv_layer.dtype == torch.int8:
        k, v = kv_quant.quantize_rows(k), kv_quant.quantize_rows(v)
    flat = kv_layer.view(2, -1, *kv_layer.shape[-2:])
    flat[0].index_copy_(0, slots, k)
    flat[1].index_copy_(0, slots, v)


@kernel
def _quantize_rows(x, mask):
    """kv_quant.quantize_rows of the entries of x [H, D] float32 under `mask`: int8 codes [H, D] and the two bytes
    of each row's bfloat16 scale, low [H] and high [H]."""
    x = tl.where(mask, x, 0.0)  # a masked load's lanes are undefined on a GPU
    amax = tl.max(tl.abs(x), axis=1)
    # scale = bf16(amax / 127), rounded to nearest even on the bits (the interpreter's float cast truncates); the
    # division is IEEE's, as torch's (Triton's `/` on float32 need not be on a GPU)
    bits = tl.math.div_rn(amax, 127.0).to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    scale = (bits << 16).to(tl.float32, bitcast=True)[:, None]
    y = tl.where(scale > 0, tl.math.div_rn(x, tl.where(scale > 0, scale, 1.0)), 0.0)
    # round half to even (libdevice's rint has no interpreter version); y - floor(y) is exact
    low = tl.floor(y)
    frac = y - low
    odd = low - 2.0 * tl.floor(low * 0.5)
    y = low + tl.where((frac > 0.5) | ((frac == 0.5) & (odd == 1.0)), 1.0, 0.0)
    return tl.minimum(tl.maximum(y, -127.0), 127.0).to(tl.int8), (bits & 0xFF).to(tl.int8), (bits >> 8).to(tl.int8)


@kernel
def _store_kv_kernel(
    k_ptr,  # [T, Hkv, d], last dim contiguous
    v_ptr,  # [T, Hkv, d], last dim contiguous
    cache_ptr,  # [2, blocks * block_size, Hkv, W] contiguous: W = d, or d + 2 in an int8 pool
    slots_ptr,  # [T] int64
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kv,  # elements between the K and the V half of the cache
    stride_slot,  # Hkv * W
    stride_head,  # W
    num_kv_heads,
    head_dim,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    KV_INT8: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + tok).to(tl.int64)
    if slot >= 0:  # a negative slot marks a padding token: nothing to store
        heads = tl.arange(0, BLOCK_H)[:, None]
        dims = tl.arange(0, BLOCK_D)[None, :]
        mask = (heads < num_kv_heads) & (dims < head_dim)
        row = cache_ptr + slot * stride_slot + heads * stride_head
        key = tl.load(k_ptr + tok * stride_kt + heads * stride_kh + dims, mask=mask)
        value = tl.load(v_ptr + tok * stride_vt + heads * stride_vh + dims, mask=mask)
        if KV_INT8:  # each row: d codes, then its scale's two bytes (little-endian)
            head_mask = heads < num_kv_heads
            key, k_low, k_high = _quantize_rows(key.to(tl.float32), mask)
            value, v_low, v_high = _quantize_rows(value.to(tl.float32), mask)
            tl.store(row + head_dim, k_low[:, None], mask=head_mask)
            tl.store(row + head_dim + 1, k_high[:, None], mask=head_mask)
            tl.store(row + head_dim + stride_kv, v_low[:, None], mask=head_mask)
            tl.store(row + head_dim + 1 + stride_kv, v_high[:, None], mask=head_mask)
        tl.store(row + dims, key, mask=mask)
        tl.store(row + dims + stride_kv, value, mask=mask)


def store_kv_triton(k: torch.Tensor, v: torch.Tensor, kv_layer: torch.Tensor, slots: torch.Tensor) -> None:
    """Same contract as store_kv_ref: k, v [T, Hkv, d] into kv_layer [2, blocks, bs, Hkv, d] at slots [T] (an int8
    pool: rows of d + kv_quant.SCALE_BYTES, quantized here)."""
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
            k.stride(0), k.stride(1), v.stride(0), v.stride(1), kv_layer.stride(0), kv_layer.stride(2),
            kv_layer.stride(3), num_kv_heads, head_dim,
            BLOCK_H=next_pow2(num_kv_heads), BLOCK_D=next_pow2(head_dim), KV_INT8=kv_layer.dtype == torch.int8,
            num_warps=4,
        )  # fmt: skip
