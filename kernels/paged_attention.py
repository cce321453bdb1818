"""Attention over a paged KV cache: decode (one query per sequence) and prefill (packed queries,
possibly after an already-cached prefix). Torch references (the fast CPU path) and Triton kernels.

A sliding window (`window`: Mistral's, Gemma 3's local layers) lets the query at position p see keys
p - window < k <= p; blocks wholly before every query's window are never read (they may be freed).

Triton: a tile of BLOCK_N keys finds its pages in the block table. Decode runs one program per
(sequence, KV head, split), the query-head group as the rows of one dot; split-K partial softmax
states are merged by a second kernel. Prefill runs BLOCK_M query rows of one sequence and head per
program, finding its tile from cu_seqlens_q without a host sync.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from fleetctl.kernels import kv_quant
from fleetctl.kernels.attention_launch import decode_partition, decode_tiles
from fleetctl.kernels.triton_support import dot_numerics, interpreting, kernel, next_pow2

if TYPE_CHECKING:
    import triton.language as tl


def gather_kv(
    kv_layer: torch.Tensor, block_table: torch.Tensor, length: int, first_block: int = 0,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """kv_layer: [2, blocks, bs, Hkv, d] (an int8 pool: [.., d + kv_quant.SCALE_BYTES] rows); block_table:
    [>= ceil(length/bs)] -> k, v: [length - first_block*bs, Hkv, d], the keys from block `first_block` on (an int8
    pool's dequantized to `dtype`)."""
    _, blocks, block_size, num_kv_heads, width = kv_layer.shape
    num_blocks = -(-length // block_size) - first_block
    # index_select on a flattened view: several times faster than advanced indexing on CPU
    kv = kv_layer.view(2, blocks, -1).index_select(1, block_table[first_block : first_block + num_blocks].long())
    kv = kv.view(2, num_blocks * block_size, num_kv_heads, width)[:, : length - first_block * block_size]
    if kv_layer.dtype == torch.int8:
        kv = kv_quant.dequantize_rows(kv, dtype or torch.float32)
    return kv[0], kv[1]


def window_start(position: int, window: int | None) -> int:
    """The first key the query at `position` sees."""
    return 0 if window is None else max(0, position - window + 1)


@dataclass(frozen=True)
class DecodeKeys:
    """The pool blocks a decode step's sequences attend to, laid out once per step: every layer (of one
    window) gathers the same blocks from its own pool (computing this per layer cost ~10 small ops and a
    host sync each)."""

    index: torch.Tensor  # [B * n] int64: each sequence's n blocks from its first in the window, in turn
    length: int  # keys gathered per sequence: n * block_size, cut to the longest context without a window
    mask: torch.Tensor | None  # [B, 1, 1, length] bool: the keys each sequence sees; None when all of them


def decode_keys(
    block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int, window: int | None = None
) -> DecodeKeys:
    """block_tables: [B, max_blocks] int32; context_lens: [B] int32 (keys per sequence, including the
    current token); window: the layers' sliding window, None for full attention."""
    longest = int(context_lens.max())
    if window is None or window >= longest:
        num_blocks = -(-longest // block_size)
        mask = None
        if block_tables.shape[0] > 1:
            positions = torch.arange(longest, device=context_lens.device)
            mask = (positions[None, :] < context_lens[:, None])[:, None, None, :]
        return DecodeKeys(block_tables[:, :num_blocks].reshape(-1).long(), longest, mask)
    # from each sequence's first block in the window: at most this many blocks hold its `window` keys
    num_blocks = min(-(-longest // block_size), (window + block_size - 2) // block_size + 1)
    lens = context_lens.long()
    first_block = (lens - window).clamp(min=0) // block_size  # [B]
    columns = (first_block[:, None] + torch.arange(num_blocks, device=lens.device)).clamp(
        max=block_tables.shape[1] - 1)
    index = block_tables.long().gather(1, columns)  # [B, n]
    positions = first_block[:, None] * block_size + torch.arange(num_blocks * block_size, device=lens.device)
    seen = (positions < lens[:, None]) & (positions >= lens[:, None] - window)
    return DecodeKeys(index.reshape(-1), num_blocks * block_size, seen[:, None, None, :])


def paged_decode_attention_ref(
    q: torch.Tensor,
    kv_layer: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    keys: DecodeKeys | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """q: [B, H, d]; block_tables: [B, max_blocks] int32; context_lens: [B] int32 (keys per sequence,
    including the current token); `keys`: decode_keys of those (and of `window`), when the caller computed
    them once for every layer. Returns [B, H, d]."""
    batch, num_heads, head_dim = q.shape
    _, blocks, block_size, num_kv_heads, width = kv_layer.shape
    if keys is None:
        keys = decode_keys(block_tables, context_lens, block_size, window)
    kv = kv_layer.view(2, blocks, -1).index_select(1, keys.index)
    kv = kv.view(2, batch, -1, num_kv_heads, width)[:, :, : keys.length]
    if kv_layer.dtype == torch.int8:
        kv = kv_quant.dequantize_rows(kv, q.dtype)
    kv = kv.transpose(2, 3)
    # The query heads sharing a KV head become that head's query rows: [B, Hkv, group, d] against
    # [B, Hkv, L, d]. Same math as repeating K/V per query head, without the copies (and ~4x faster).
    rows = q.view(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
    out = F.scaled_dot_product_attention(rows, kv[0], kv[1], attn_mask=keys.mask, scale=scale)
    return out.reshape(batch, num_heads, head_dim)


def prefill_attention_ref(
    q: torch.Tensor,
    kv_layer: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """Causal attention for packed queries. q: [T, H, d] (sequence i owns rows
    cu_seqlens_q[i]:cu_seqlens_q[i+1], the last tokens of its context); block_tables: [B, max_blocks];
    context_lens: [B] (cached prefix + new tokens). K/V for the new tokens are already in the cache.
    Returns [T, H, d]."""
    out = torch.empty_like(q)
    bounds = cu_seqlens_q.tolist()
    block_size = kv_layer.shape[2]
    for i, length in enumerate(context_lens.tolist()):
        start, end = bounds[i], bounds[i + 1]
        new = end - start
        prefix = length - new
        first_block = window_start(prefix, window) // block_size
        k, v = gather_kv(kv_layer, block_tables[i], length, first_block, q.dtype)
        mask = None
        if prefix or (window is not None and window < length):
            rows = torch.arange(new, device=q.device)[:, None] + prefix
            keys = torch.arange(first_block * block_size, length, device=q.device)[None, :]
            mask = (keys <= rows) if window is None else (keys <= rows) & (keys > rows - window)
        # 4-D [1, heads, tokens, d]: torch's CPU flash kernel takes only that; a 3-D call falls back to the
        # math path, which materializes the whole [heads, tokens, tokens] score matrix (8x slower at 500 tokens)
        out[start:end] = F.scaled_dot_product_attention(
            q[start:end].transpose(0, 1)[None],
            k.transpose(0, 1)[None],
            v.transpose(0, 1)[None],
            attn_mask=mask,
            is_causal=mask is None,
            scale=scale,
            enable_gqa=True,
        )[0].transpose(0, 1)
    return out


@kernel
def _row_scale(ptrs, mask):
    """The bfloat16 scale at `ptrs` [N] (two int8, little-endian) as float32 [N]; masked rows read 0."""
    low = tl.load(ptrs, mask=mask, other=0).to(tl.int32) & 0xFF
    high = tl.load(ptrs + 1, mask=mask, other=0).to(tl.int32)
    return ((high << 24) | (low << 16)).to(tl.float32, bitcast=True)  # a bfloat16 is a float32's top half


@kernel
def _load_kv(table, kv_base, keys, key_mask, dims, head_dim, stride_kv, stride_blk, stride_pos, PAGE: tl.constexpr,
             KV_INT8: tl.constexpr):  # fmt: skip
    """K and V rows for `keys` [N] through a block table row, at `dims` [1, D] of the KV head's rows from `kv_base`
    (an int8 pool's dequantized to float32); masked rows read 0. Returns k, v: [N, D]."""
    page = tl.load(table + keys // PAGE, mask=key_mask, other=0).to(tl.int64)
    rows = kv_base + page * stride_blk + (keys % PAGE) * stride_pos
    mask = key_mask[:, None] & (dims < head_dim)
    k = tl.load(rows[:, None] + dims, mask=mask, other=0.0)
    v = tl.load(rows[:, None] + dims + stride_kv, mask=mask, other=0.0)
    if KV_INT8:  # a row: head_dim codes, then their scale
        k = k.to(tl.float32) * _row_scale(rows + head_dim, key_mask)[:, None]
        v = v.to(tl.float32) * _row_scale(rows + head_dim + stride_kv, key_mask)[:, None]
    return k, v


@kernel
def _attend(q, k, v, valid, m, lsum, acc, scale, MASKED: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """One online-softmax step. q: [M, D]; k, v: [N, D]; valid: [M, N] (when MASKED); m, lsum: [M]
    running max (log2 units) and sum; acc: [M, D] float32. Returns the new (m, lsum, acc)."""
    k, v = k.to(q.dtype), v.to(q.dtype)  # an int8 pool's dequantized float32 rounds as the reference's does
    if UPCAST:  # the interpreter has no 16-bit dot: compute on float32 copies
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision=PRECISION) * scale
    else:
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
    if MASKED:
        s = tl.where(valid, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    # a row with no key yet (a tile wholly outside its window) keeps m = -inf: subtract 0 instead, not -inf - -inf
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m - m_ref)
    p = tl.exp2(s - m_ref[:, None])
    lsum = lsum * alpha + tl.sum(p, axis=1)
    p = p.to(v.dtype)
    if UPCAST:
        pv = tl.dot(p.to(tl.float32), v.to(tl.float32), input_precision=PRECISION)
    else:
        pv = tl.dot(p, v, input_precision=PRECISION)
    return m_new, lsum, acc * alpha[:, None] + pv


@kernel
def _attend_span(
    q, m, lsum, acc, table, kv_base, lo, hi, positions, window, dims, head_dim, qk_scale, stride_kv, stride_blk,
    stride_pos, PAGE: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    KV_INT8: tl.constexpr,
):  # fmt: skip
    """Keys lo <= k < hi against query rows at `positions` [M], each seeing p - window < k <= p."""
    for first in range(lo, hi, BLOCK_N):
        keys = first + tl.arange(0, BLOCK_N)
        inside = keys < hi
        k, v = _load_kv(table, kv_base, keys, inside, dims, head_dim, stride_kv, stride_blk, stride_pos, PAGE, KV_INT8)
        valid = inside[None, :] & (keys[None, :] <= positions[:, None]) & (keys[None, :] > positions[:, None] - window)
        m, lsum, acc = _attend(q, k, v, valid, m, lsum, acc, qk_scale, True, UPCAST, PRECISION)
    return m, lsum, acc


@kernel
def _decode_kernel(
    q_ptr, kv_ptr, tables_ptr, lens_ptr, out_ptr, part_acc_ptr, part_ml_ptr, qk_scale,
    stride_qb, stride_qh, stride_ob, stride_oh, stride_table, stride_kv, stride_blk, stride_pos, stride_kvh,
    num_heads, head_dim, num_splits, partition, window,
    GROUP: tl.constexpr, PAGE: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    SPLIT: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr, KV_INT8: tl.constexpr,
):  # fmt: skip
    seq, kv_head, split = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    length = tl.load(lens_ptr + seq)
    start = tl.maximum(split * partition, length - window)  # keys before the window are never read
    end = tl.minimum(split * partition + partition, length)
    if start < end:
        rows, dims = tl.arange(0, BLOCK_G), tl.arange(0, BLOCK_D)[None, :]
        heads = kv_head * GROUP + rows
        row_mask = (rows[:, None] < GROUP) & (dims < head_dim)
        q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims, mask=row_mask, other=0.0)
        m = tl.full([BLOCK_G], float("-inf"), tl.float32)
        lsum = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        table, kv_base = tables_ptr + seq * stride_table, kv_ptr + kv_head * stride_kvh
        for first in range(start, end, BLOCK_N):
            keys = first + tl.arange(0, BLOCK_N)
            k, v = _load_kv(table, kv_base, keys, keys < end, dims, head_dim, stride_kv, stride_blk, stride_pos, PAGE,
                            KV_INT8)
            m, lsum, acc = _attend(q, k, v, keys[None, :] < end, m, lsum, acc, qk_scale, True, UPCAST, PRECISION)
        if SPLIT:  # partial state of this split: [B, H, S, d] unnormalized acc, [B, H, S, 2] (max, sum)
            part = (seq * num_heads + heads) * num_splits + split
            tl.store(part_acc_ptr + part[:, None] * head_dim + dims, acc, mask=row_mask)
            tl.store(part_ml_ptr + part * 2, m, mask=rows < GROUP)
            tl.store(part_ml_ptr + part * 2 + 1, lsum, mask=rows < GROUP)
        else:
            out = (acc / lsum[:, None]).to(out_ptr.dtype.element_ty)
            tl.store(out_ptr + seq * stride_ob + heads[:, None] * stride_oh + dims, out, mask=row_mask)


@kernel
def _decode_reduce_kernel(
    lens_ptr, part_acc_ptr, part_ml_ptr, out_ptr, stride_ob, stride_oh, num_heads, head_dim, num_splits, partition,
    window, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    seq, head = tl.program_id(0).to(tl.int64), tl.program_id(1)
    splits, dims = tl.arange(0, BLOCK_S), tl.arange(0, BLOCK_D)
    length = tl.load(lens_ptr + seq)
    # splits past the context or wholly before the window wrote nothing
    used = (splits < tl.cdiv(length, partition)) & ((splits + 1) * partition > length - window)
    part = (seq * num_heads + head) * num_splits + splits
    m = tl.load(part_ml_ptr + part * 2, mask=used, other=float("-inf"))
    lsum = tl.load(part_ml_ptr + part * 2 + 1, mask=used, other=0.0)
    acc_mask = used[:, None] & (dims[None, :] < head_dim)
    acc = tl.load(part_acc_ptr + part[:, None] * head_dim + dims[None, :], mask=acc_mask, other=0.0)
    weight = tl.exp2(m - tl.max(m, axis=0))
    out = (tl.sum(acc * weight[:, None], axis=0) / tl.sum(lsum * weight, axis=0)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + seq * stride_ob + head * stride_oh + dims, out, mask=dims < head_dim)


@kernel
def _prefill_kernel(
    q_ptr, kv_ptr, tables_ptr, lens_ptr, cu_ptr, out_ptr, qk_scale,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_table, stride_kv, stride_blk, stride_pos, stride_kvh,
    num_seqs, head_dim, window,
    GROUP: tl.constexpr, PAGE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr, KV_INT8: tl.constexpr,
):  # fmt: skip
    # Sequence i owns programs [cu[i] // BLOCK_M + i, cu[i + 1] // BLOCK_M + i + 1): enough for its
    # tiles, found by binary search; the spare last program of a sequence has no rows and exits.
    tile_id, head = tl.program_id(0), tl.program_id(1)
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(cu_ptr + mid) // BLOCK_M + mid <= tile_id:
            lo = mid + 1
        else:
            hi = mid
    seq = lo - 1
    q_start = tl.load(cu_ptr + seq)
    new = tl.load(cu_ptr + seq + 1) - q_start
    tile = tile_id - (q_start // BLOCK_M + seq)
    if tile * BLOCK_M < new:
        context = tl.load(lens_ptr + seq)
        rows, dims = tile * BLOCK_M + tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_D)[None, :]
        positions = context - new + rows  # each query row's position in its sequence
        row_mask = (rows[:, None] < new) & (dims < head_dim)
        tokens = (q_start + rows).to(tl.int64)
        q = tl.load(q_ptr + tokens[:, None] * stride_qt + head * stride_qh + dims, mask=row_mask, other=0.0)
        m = tl.full([BLOCK_M], float("-inf"), tl.float32)
        lsum = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        table, kv_base = tables_ptr + seq.to(tl.int64) * stride_table, kv_ptr + (head // GROUP) * stride_kvh
        first_pos = context - new + tile * BLOCK_M
        end = tl.minimum(first_pos + BLOCK_M, context)
        # keys [full_lo, full_hi) are seen by every row, without a mask; before them the window's edge (each
        # row's own), after them the diagonal. Without a window full_lo is 0.
        lo = tl.maximum(first_pos - window + 1, 0)
        full_hi = first_pos // BLOCK_N * BLOCK_N
        full_lo = tl.minimum(tl.cdiv(tl.maximum(end - window, 0), BLOCK_N) * BLOCK_N, full_hi)
        m, lsum, acc = _attend_span(q, m, lsum, acc, table, kv_base, lo, full_lo, positions, window, dims, head_dim,
                                    qk_scale, stride_kv, stride_blk, stride_pos, PAGE, BLOCK_N, UPCAST, PRECISION,
                                    KV_INT8)
        for first in range(full_lo, full_hi, BLOCK_N):
            keys = first + tl.arange(0, BLOCK_N)
            k, v = _load_kv(table, kv_base, keys, keys < full_hi, dims, head_dim, stride_kv, stride_blk,
                            stride_pos, PAGE, KV_INT8)
            m, lsum, acc = _attend(q, k, v, 0, m, lsum, acc, qk_scale, False, UPCAST, PRECISION)
        m, lsum, acc = _attend_span(q, m, lsum, acc, table, kv_base, tl.maximum(full_hi, lo), end, positions,
                                    window, dims, head_dim, qk_scale, stride_kv, stride_blk, stride_pos, PAGE,
                                    BLOCK_N, UPCAST, PRECISION, KV_INT8)
        out = (acc / lsum[:, None]).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + tokens[:, None] * stride_ot + head * stride_oh + dims, out, mask=row_mask)


def paged_decode_attention_triton(
    q: torch.Tensor, kv_layer: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
    partition: int | None = None, window: int | None = None,
) -> torch.Tensor:  # fmt: skip
    """Same contract as paged_decode_attention_ref: q [B, H, d] -> [B, H, d]. `partition` (keys per
    split-K program) is chosen from the device's size when None; no host sync either way. A window's splits
    wholly before it exit at once."""
    q = q if q.stride(-1) == 1 else q.contiguous()
    batch, num_heads, head_dim = q.shape
    _, _, page, num_kv_heads, _ = kv_layer.shape
    out = torch.empty_like(q)
    max_len = max(1, block_tables.shape[1] * page)  # bounds context_lens, known without a sync
    block_n, warps = decode_tiles(q.dtype, head_dim)
    if partition is None:
        partition = decode_partition(batch, num_kv_heads, max_len, block_n, q.device)
    num_splits = -(-max_len // partition)
    split = num_splits > 1
    part_acc = q.new_empty(batch, num_heads, num_splits, head_dim, dtype=torch.float32) if split else out
    part_ml = q.new_empty(batch, num_heads, num_splits, 2, dtype=torch.float32) if split else out
    upcast, precision = dot_numerics(q.dtype)
    block_d, group = max(16, next_pow2(head_dim)), num_heads // num_kv_heads
    if batch:
        _decode_kernel[(batch, num_kv_heads, num_splits)](
            q, kv_layer, block_tables, context_lens, out, part_acc, part_ml, scale * math.log2(math.e),
            q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
            kv_layer.stride(0), kv_layer.stride(1), kv_layer.stride(2), kv_layer.stride(3),
            num_heads, head_dim, num_splits, partition, window or max_len,
            GROUP=group, PAGE=page, BLOCK_G=max(16, next_pow2(group)), BLOCK_N=block_n, BLOCK_D=block_d,
            SPLIT=split, UPCAST=upcast, PRECISION=precision, KV_INT8=kv_layer.dtype == torch.int8, num_warps=warps,
            num_stages=2,
        )  # fmt: skip
    if batch and split:
        _decode_reduce_kernel[(batch, num_heads)](
            context_lens, part_acc, part_ml, out, out.stride(0), out.stride(1), num_heads, head_dim, num_splits,
            partition, window or max_len, BLOCK_S=next_pow2(num_splits), BLOCK_D=block_d, num_warps=4,
        )  # fmt: skip
    return out


def prefill_attention_triton(
    q: torch.Tensor, kv_layer: torch.Tensor, block_tables: torch.Tensor, cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor, scale: float, block_m: int | None = None, block_n: int | None = None,
    window: int | None = None,
) -> torch.Tensor:  # fmt: skip
    """Same contract as prefill_attention_ref: packed q [T, H, d] -> [T, H, d]; K/V of the new tokens
    are already in kv_layer. block_m, block_n override the tile sizes (tests, tuning)."""
    q = q if q.stride(-1) == 1 else q.contiguous()
    tokens, num_heads, head_dim = q.shape
    _, _, page, num_kv_heads, _ = kv_layer.shape
    num_seqs = context_lens.shape[0]
    # tiles (about) without register spills on sm_90 (ptxas -v); 128 rows keep warpgroup MMA for 16-bit
    wide = 64 if head_dim <= 64 else 32
    tiles = (64, 64, 4) if interpreting() else (32, 16, 8) if q.dtype == torch.float32 else (128, wide, 8)
    block_m, block_n = block_m or tiles[0], block_n or tiles[1]
    out = torch.empty_like(q)
    upcast, precision = dot_numerics(q.dtype)
    if tokens:
        _prefill_kernel[(tokens // block_m + num_seqs, num_heads)](
            q, kv_layer, block_tables, context_lens, cu_seqlens_q, out, scale * math.log2(math.e),
            q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
            kv_layer.stride(0), kv_layer.stride(1), kv_layer.stride(2), kv_layer.stride(3),
            num_seqs, head_dim, window or max(1, block_tables.shape[1] * page),
            GROUP=num_heads // num_kv_heads, PAGE=page, BLOCK_M=block_m, BLOCK_N=block_n,
            BLOCK_D=max(16, next_pow2(head_dim)), UPCAST=upcast, PRECISION=precision,
            KV_INT8=kv_layer.dtype == torch.int8, num_warps=tiles[2], num_stages=2,
        )  # fmt: skip
    return out
