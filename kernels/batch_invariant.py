"""Batch invariance by construction, for the engine's deterministic mode: every op whose per-row
result could depend on the rest of the batch runs on fixed shapes.

- Row-wise ops (linear layers, RMSNorm, rotary, the gated activations, the logits) run on tiles of exactly
  ROW_TILE rows (`per_row_tile`): a kernel library picks its blocking, vectorisation and threading from
  the shape, so one shape means one summation order.
- Attention: a query row at position p is computed in a tile of TILE positions (row p at index
  p % TILE) against exactly the keys 0 .. TILE*(p//TILE+1), later keys masked out — the same whether it
  arrives in a prefill or a decode step, alone or beside other sequences. With a sliding window the
  tile's keys start at the block holding its first position's window start (up to TILE - 1 + block_size - 1
  keys before a row's own window, masked), again a function of the tile alone.
"""

from collections.abc import Callable
from typing import TypeVar

import torch

from fleetctl.kernels.paged_attention import gather_kv, window_start

TILE = 16  # attention: query positions per tile
ROW_TILE = 8  # row-wise ops: rows per call (a decode batch of 1 computes 8 rows: memory-bound, so nearly free)
TileResult = TypeVar("TileResult", torch.Tensor, tuple[torch.Tensor, ...])


def invariant_attention(
    q: torch.Tensor,
    kv_layer: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """Same contract as prefill_attention_ref (decode is the case of one query per sequence).
    q: [T, H, d] -> [T, H, d]."""
    num_heads, head_dim = q.shape[1:]
    block_size, num_kv_heads = kv_layer.shape[2:4]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    offsets = torch.arange(TILE, device=q.device)
    bounds = cu_seqlens_q.tolist()
    for i, length in enumerate(context_lens.tolist()):
        start, end = bounds[i], bounds[i + 1]
        padded = -(-length // TILE) * TILE
        first = length - (end - start)
        base = _first_key(first // TILE, window, block_size)
        k, v = gather_kv(kv_layer, block_tables[i], padded, base // block_size, q.dtype)  # [padded - base, Hkv, d]
        k = k.permute(1, 2, 0)  # [Hkv, d, padded - base]
        v = v.transpose(0, 1)  # [Hkv, padded - base, d]
        for tile in range(first // TILE, padded // TILE):
            lo, hi = max(first, tile * TILE), min(length, (tile + 1) * TILE)
            key_lo, key_hi = _first_key(tile, window, block_size), (tile + 1) * TILE
            keys = key_hi - key_lo
            rows = torch.zeros(TILE, num_heads, head_dim, dtype=q.dtype, device=q.device)
            rows[lo - tile * TILE : hi - tile * TILE] = q[start + lo - first : start + hi - first]
            rows = rows.view(TILE, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
            tile_k, tile_v = k[..., key_lo - base : key_hi - base], v[:, key_lo - base : key_hi - base]
            scores = torch.matmul(rows.reshape(num_kv_heads, group * TILE, head_dim), tile_k)
            scores = scores.float().view(num_kv_heads, group, TILE, keys) * scale
            positions = offsets[:, None] + tile * TILE
            key_positions = torch.arange(key_lo, key_hi, device=q.device)[None, :]
            allowed = key_positions <= positions
            if window is not None:
                allowed &= key_positions > positions - window
            probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1).to(v.dtype)
            mixed = torch.matmul(probs.view(num_kv_heads, group * TILE, keys), tile_v)
            mixed = mixed.view(num_kv_heads, group, TILE, head_dim).permute(2, 0, 1, 3)
            out[start + lo - first : start + hi - first] = mixed.reshape(TILE, num_heads, head_dim)[
                lo - tile * TILE : hi - tile * TILE
            ]
    return out


def _first_key(tile: int, window: int | None, block_size: int) -> int:
    """The first key a tile's rows are computed against: block-aligned, and a function of the tile alone."""
    return window_start(tile * TILE, window) // block_size * block_size


def per_row_tile(op: Callable[..., TileResult], *rows: torch.Tensor | None) -> TileResult:
    """`op` applied to fixed-shape tiles of ROW_TILE rows of `rows` (each [T, ...], or None), zero-padded
    at the end; its outputs ([ROW_TILE, ...] each) joined and cut back to T rows.

    Every call of `op` then sees the same shapes whatever the batch, so it takes the same code path
    (GEMM blocking, vector/scalar split, thread partition) and each row comes out with the same bits."""
    count = next(r.shape[0] for r in rows if r is not None)
    pad = -count % ROW_TILE
    padded = [None if r is None else torch.cat((r, r.new_zeros(pad, *r.shape[1:]))) if pad else r for r in rows]
    outputs = [op(*(None if r is None else r[start : start + ROW_TILE] for r in padded))
               for start in range(0, count + pad, ROW_TILE)]
    if isinstance(outputs[0], tuple):
        return tuple(torch.cat(parts)[:count] for parts in zip(*outputs, strict=True))
    return torch.cat(outputs)[:count]
