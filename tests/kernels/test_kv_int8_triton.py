"""The Triton kernels over an int8 KV pool (rows of d codes and a bfloat16 scale, kernels/kv_quant.py) against the
torch references over the same pool: store_kv's bytes exactly, decode and prefill attention within the usual
tolerances (kernel_cases.close).

The pools come from kernel_cases.paged_pool: its NaN rows (unused slots, padding pages) quantize to codes 0 and a NaN
scale, so a kernel that reads one gets NaN; the references get the pool quantized from `nan_to_num` (zeros there).
"""

import pytest
import torch

from fleetctl.kernels.kv_quant import LEVELS, quantize_rows
from fleetctl.kernels.paged_attention import (
    paged_decode_attention_ref,
    paged_decode_attention_triton,
    prefill_attention_ref,
    prefill_attention_triton,
)
from fleetctl.kernels.store_kv import store_kv_ref, store_kv_triton
from fleetctl.tests.support.kernel_cases import DEVICE, DTYPES, PAGE, close, paged_pool, randn

# (heads, kv_heads, head_dim): a 3:1 group at head_dim 64, a 2:1 group at 16
SHAPES = [(9, 3, 64), (4, 2, 16)]
DECODE_LENGTHS = [1, 15, 17, 130]
# (cached prefix, new tokens) per sequence of one packed batch
PREFILL_SEQS = [(0, 1), (16, 1), (15, 17), (100, 40), (0, 70)]
WINDOW = 24  # not a multiple of the page


def int8_pools(
    lengths: list[int], kv_heads: int, head_dim: int, dropped: list[int] | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """paged_pool of `lengths` in int8, with each sequence's first `dropped[i]` pages (those wholly before its
    window) unreadable by the kernels. Returns the kernels' pool, the references' pool, tables and lengths."""
    pool, tables, lens = paged_pool(lengths, kv_heads, head_dim, torch.float32)
    ref_pool = quantize_rows(pool.nan_to_num())
    for i, pages in enumerate(dropped or []):
        pool[:, tables[i, :pages].long()] = float("nan")
    return quantize_rows(pool), ref_pool, tables, lens


def tie_rows(head_dim: int) -> torch.Tensor:
    """Rows [4, d] whose quantization meets ties: codes at exactly .5 (scale 1), a scale halfway between two
    bfloat16 (rounds down to even, then up to even), and a row of zeros."""
    rows = torch.zeros(4, head_dim)
    halves = torch.arange(head_dim - 1, dtype=torch.float32) - head_dim // 2 + 0.5  # ..., -1.5, -0.5, 0.5, 1.5, ...
    rows[0, 0], rows[0, 1:] = LEVELS, halves
    rows[1, 0], rows[1, 1:] = LEVELS * 1.00390625, halves  # 1 + 2**-8: halfway from bf16 1.0 to 1.0078125
    rows[2, 0], rows[2, 1:] = LEVELS * 1.01171875, halves  # 1 + 3 * 2**-8: halfway from 1.0078125 to 1.015625
    return rows


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "kv_heads", "head_dim"), [(1, 3, 64), (37, 2, 16), (5, 8, 128)])
def test_store_kv_quantizes_like_the_reference(dtype: torch.dtype, tokens: int, kv_heads: int, head_dim: int) -> None:
    gen = torch.Generator().manual_seed(5)
    kv = randn(tokens, 2, kv_heads, head_dim, seed=1) * 3
    for i, row in enumerate(tie_rows(head_dim)[: tokens * kv_heads]):  # into the first keys' heads
        kv[i // kv_heads, 0, i % kv_heads] = row.to(DEVICE)
    k, v = kv.to(dtype).unbind(1)  # strided, as the model's projections are
    kv_layer = torch.randint(-128, 128, (2, 8, PAGE, kv_heads, head_dim + 2), generator=gen, dtype=torch.int8)
    kv_layer = kv_layer.to(DEVICE)
    expected = kv_layer.clone()
    slots = torch.randperm(8 * PAGE, generator=gen)[:tokens].to(DEVICE)
    store_kv_ref(k, v, expected, slots)
    store_kv_triton(k, v, kv_layer, slots)
    torch.testing.assert_close(kv_layer, expected, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("partition", [None, 32], ids=["one-split", "split-k"])
def test_decode_attention(dtype: torch.dtype, shape: tuple[int, int, int], partition: int | None) -> None:
    heads, kv_heads, head_dim = shape
    kv_layer, ref_pool, tables, lens = int8_pools(DECODE_LENGTHS, kv_heads, head_dim)
    q = randn(len(DECODE_LENGTHS), heads, head_dim, dtype=dtype, seed=8)
    scale = head_dim**-0.5
    out = paged_decode_attention_triton(q, kv_layer, tables, lens, scale, partition=partition)
    close(out, paged_decode_attention_ref(q, ref_pool, tables, lens, scale), attention=True)


@pytest.mark.parametrize("dtype", DTYPES)
# the 3:1 group's prefill is ~10 s a dtype in the interpreter: `make test` runs it, `make test-fast` the 2:1's
@pytest.mark.parametrize("shape", [pytest.param(SHAPES[0], marks=pytest.mark.slow), *SHAPES[1:]], ids=str)
def test_prefill_attention(dtype: torch.dtype, shape: tuple[int, int, int]) -> None:
    heads, kv_heads, head_dim = shape
    kv_layer, ref_pool, tables, lens = int8_pools([p + n for p, n in PREFILL_SEQS], kv_heads, head_dim)
    cu = torch.tensor([0] + [n for _, n in PREFILL_SEQS]).cumsum(0, dtype=torch.int32).to(DEVICE)
    q = randn(int(cu[-1]), heads, head_dim, dtype=dtype, seed=9)
    scale = head_dim**-0.5
    expected = prefill_attention_ref(q, ref_pool, tables, cu, lens, scale)
    close(prefill_attention_triton(q, kv_layer, tables, cu, lens, scale), expected, attention=True)
    # small tiles: many per sequence, unaligned diagonals
    close(prefill_attention_triton(q, kv_layer, tables, cu, lens, scale, block_m=16, block_n=32), expected, True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("partition", [None, 32], ids=["one-split", "split-k"])
def test_windowed_decode(dtype: torch.dtype, partition: int | None) -> None:
    heads, kv_heads, head_dim = SHAPES[1]
    lengths = [WINDOW + PAGE + 1, 64, 130]
    dropped = [max(0, n - WINDOW) // PAGE for n in lengths]  # the pages wholly before the window
    kv_layer, ref_pool, tables, lens = int8_pools(lengths, kv_heads, head_dim, dropped)
    q = randn(len(lengths), heads, head_dim, dtype=dtype, seed=21)
    scale = head_dim**-0.5
    out = paged_decode_attention_triton(q, kv_layer, tables, lens, scale, partition=partition, window=WINDOW)
    close(out, paged_decode_attention_ref(q, ref_pool, tables, lens, scale, window=WINDOW), attention=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_windowed_prefill(dtype: torch.dtype) -> None:
    heads, kv_heads, head_dim = SHAPES[1]
    seqs = [(0, 90), (60, 41), (130, 1)]  # a prompt longer than the window, a chunk after a prefix, one token
    dropped = [max(0, prefix - WINDOW + 1) // PAGE for prefix, _ in seqs]  # wholly before the first query's window
    kv_layer, ref_pool, tables, lens = int8_pools([p + n for p, n in seqs], kv_heads, head_dim, dropped)
    cu = torch.tensor([0] + [n for _, n in seqs]).cumsum(0, dtype=torch.int32).to(DEVICE)
    q = randn(int(cu[-1]), heads, head_dim, dtype=dtype, seed=22)
    scale = head_dim**-0.5
    expected = prefill_attention_ref(q, ref_pool, tables, cu, lens, scale, window=WINDOW)
    out = prefill_attention_triton(q, kv_layer, tables, cu, lens, scale, block_m=16, block_n=16, window=WINDOW)
    close(out, expected, attention=True)
