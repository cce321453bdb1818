"""Batch-invariant attention for the engine's deterministic mode.

A query row at position p is always computed with the same tensor shapes, whatever else is in the
batch and whether it arrives in a prefill or a decode step: rows are processed in tiles of TILE
positions (row p sits at index p % TILE of its tile) against exactly the keys 0 .. TILE*(p//TILE+1),
later keys masked out. Same shapes give the same summation order, so the same bits.
"""

import torch

from fleetctl.kernels.paged_attention import gather_kv

TILE = 16


def invariant_attention(
    q: torch.Tensor,
    kv_layer: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Same contract as prefill_attention_ref (decode is the case of one query per sequence).
    q: [T, H, d] -> [T, H, d]."""
    num_heads, head_dim = q.shape[1:]
    num_kv_heads = kv_layer.shape[3]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    offsets = torch.arange(TILE, device=q.device)
    bounds = cu_seqlens_q.tolist()
    for i, length in enumerate(context_lens.tolist()):
        start, end = bounds[i], bounds[i + 1]
        padded = -(-length // TILE) * TILE
        k, v = gather_kv(kv_layer, block_tables[i], padded)  # [padded, Hkv, d]
        k = k.permute(1, 2, 0)  # [Hkv, d, padded]
        v = v.transpose(0, 1)  # [Hkv, padded, d]
        first = length - (end - start)
        for tile in range(first // TILE, padded // TILE):
            lo, hi = max(first, tile * TILE), min(length, (tile + 1) * TILE)
            keys = (tile + 1) * TILE
            rows = torch.zeros(TILE, num_heads, head_dim, dtype=q.dtype, device=q.device)
            rows[lo - tile * TILE : hi - tile * TILE] = q[start + lo - first : start + hi - first]
            rows = rows.view(TILE, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
            scores = torch.matmul(rows.reshape(num_kv_heads, group * TILE, head_dim), k[..., :keys])
            scores = scores.float().view(num_kv_heads, group, TILE, keys) * scale
            allowed = torch.arange(keys, device=q.device)[None, :] <= offsets[:, None] + tile * TILE
            probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1).to(v.dtype)
            mixed = torch.matmul(probs.view(num_kv_heads, group * TILE, keys), v[:, :keys])
            mixed = mixed.view(num_kv_heads, group, TILE, head_dim).permute(2, 0, 1, 3)
            out[start + lo - first : start + hi - first] = mixed.reshape(TILE, num_heads, head_dim)[
                lo - tile * TILE : hi - tile * TILE
            ]
    return out


def invariant_linear(x: torch.Tensor, weight: torch.Tensor, row_multiple: int = 8) -> torch.Tensor:
    """x: [T, K]; weight: [N, K] -> [T, N], computed with T padded to a multiple of row_multiple.

    CPU GEMM kernels pick their blocking (and so their summation order) from the matrix shape; a
    single row takes a GEMV path with a different order. Padding keeps each row's result the same
    whatever the batch (checked here for fp32 and bf16, multiples of 4 and up)."""
    rows = x.shape[0]
    pad = -rows % row_multiple
    if pad:
        x = torch.cat((x, x.new_zeros(pad, x.shape[1])))
    return torch.nn.functional.linear(x, weight)[:rows]
