"""Sliding-window attention (the query at p sees keys p - window < k <= p) in every attention path: the
torch references, the Triton kernels (interpreted on a CPU) and the batch-invariant tiles, against a
dense oracle computed from the keys themselves. The pages wholly before each sequence's window hold NaN,
so a path that reads them fails: those are the blocks a windowed sequence may free."""

import pytest
import torch

from fleetctl.kernels.batch_invariant import TILE, invariant_attention
from fleetctl.kernels.paged_attention import (
    gather_kv,
    paged_decode_attention_ref,
    paged_decode_attention_triton,
    prefill_attention_ref,
    prefill_attention_triton,
)
from fleetctl.tests.support.kernel_cases import DEVICE, DTYPES, PAGE, close, paged_pool, randn

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16
WINDOW = 24  # not a multiple of the page: the window's first page is partly inside
SCALE = HEAD_DIM**-0.5


def oracle(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, window: int) -> torch.Tensor:
    """q: [n, H, d] at `positions` [n]; k, v: [L, Hkv, d] of one sequence -> [n, H, d], in float64."""
    group = HEADS // KV_HEADS
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    scores = torch.einsum("nhd,lhd->hnl", q.double(), k) * SCALE
    keys = torch.arange(k.shape[0], device=q.device)[None, :]
    seen = (keys <= positions[:, None]) & (keys > positions[:, None] - window)
    probs = scores.masked_fill(~seen, float("-inf")).softmax(-1)
    return torch.einsum("hnl,lhd->nhd", probs, v).to(q.dtype)


def windowed_pool(
    contexts: list[int], first_queries: list[int], dtype: torch.dtype, slack: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """paged_pool of `contexts` with, per sequence, the pages wholly before the window of its first query
    (less `slack` keys) set to NaN. Returns the pool for the kernels (every unused slot NaN), the same for the
    references (NaN only where they must not read), the tables, the lengths, and each sequence's k, v
    [L, Hkv, d] for the oracle. A sequence whose first query is at 0 (a fresh prompt) drops nothing."""
    kv_layer, tables, lens = paged_pool(contexts, KV_HEADS, HEAD_DIM, dtype)
    finite = kv_layer.nan_to_num()
    keys = [gather_kv(finite, tables[i], n) for i, n in enumerate(contexts)]
    for i, first in enumerate(first_queries):
        dropped = max(0, first - WINDOW + 1 - slack) // PAGE  # pages wholly before the first query's window
        assert dropped > 0 or first == 0, "every chunk after a prefix must hold a page to drop"
        pages = tables[i, :dropped].long()
        kv_layer[:, pages] = float("nan")
        finite[:, pages] = float("nan")
    return kv_layer, finite, tables, lens, keys


# context lengths of one decode batch: inside one page of the window's start, across pages, long
DECODE_CONTEXTS = [WINDOW + PAGE + 1, 64, 97, 200]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("partition", [None, 32], ids=["one-split", "split-k"])
def test_decode_sees_only_the_window(dtype: torch.dtype, partition: int | None) -> None:
    kernel_pool, ref_pool, tables, lens, keys = windowed_pool(DECODE_CONTEXTS, [n - 1 for n in DECODE_CONTEXTS], dtype)
    q = randn(len(DECODE_CONTEXTS), HEADS, HEAD_DIM, dtype=dtype, seed=21)
    expected = torch.cat([oracle(q[i : i + 1], k, v, torch.tensor([n - 1], device=DEVICE), WINDOW)
                          for i, (n, (k, v)) in enumerate(zip(DECODE_CONTEXTS, keys, strict=True))])
    close(paged_decode_attention_ref(q, ref_pool, tables, lens, SCALE, window=WINDOW), expected, attention=True)
    out = paged_decode_attention_triton(q, kernel_pool, tables, lens, SCALE, partition=partition, window=WINDOW)
    close(out, expected, attention=True)


def test_one_sequence_decode_reads_only_its_window() -> None:
    _, ref_pool, tables, lens, keys = windowed_pool([150], [149], torch.float32)
    q = randn(1, HEADS, HEAD_DIM, seed=22)
    expected = oracle(q, *keys[0], torch.tensor([149], device=DEVICE), WINDOW)
    close(paged_decode_attention_ref(q, ref_pool, tables[:1], lens, SCALE, window=WINDOW), expected, attention=True)


# (cached prefix, new tokens): a prompt longer than the window, a chunk after a prefix, one token
PREFILL_SEQS = [(0, 90), (60, 41), (130, 1)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tiles", [None, (16, 32)], ids=["default-tiles", "small-tiles"])
def test_prefill_sees_only_the_window(dtype: torch.dtype, tiles: tuple[int, int] | None) -> None:
    contexts = [p + n for p, n in PREFILL_SEQS]
    kernel_pool, ref_pool, tables, lens, keys = windowed_pool(contexts, [p for p, _ in PREFILL_SEQS], dtype)
    cu = torch.tensor([0] + [n for _, n in PREFILL_SEQS], dtype=torch.int32).cumsum(0, dtype=torch.int32).to(DEVICE)
    q = randn(int(cu[-1]), HEADS, HEAD_DIM, dtype=dtype, seed=23)
    expected = torch.cat([oracle(q[cu[i] : cu[i + 1]], k, v, torch.arange(p, p + n, device=DEVICE), WINDOW)
                          for i, ((p, n), (k, v)) in enumerate(zip(PREFILL_SEQS, keys, strict=True))])
    close(prefill_attention_ref(q, ref_pool, tables, cu, lens, SCALE, window=WINDOW), expected, attention=True)
    block_m, block_n = tiles or (None, None)
    out = prefill_attention_triton(q, kernel_pool, tables, cu, lens, SCALE, block_m, block_n, WINDOW)
    close(out, expected, attention=True)


def test_batch_invariant_tiles_see_only_the_window() -> None:
    """Deterministic mode: a decode step computes its row with the same bits as the prompt's prefill did,
    the window applied, reading nothing before the block that holds its tile's window start."""
    context = 150
    kv_layer, tables, lens = paged_pool([context], KV_HEADS, HEAD_DIM, torch.float32)
    whole = kv_layer.nan_to_num()
    _, dropped, _, _, keys = windowed_pool([context], [context - 1], torch.float32, slack=TILE)
    q = randn(context, HEADS, HEAD_DIM, seed=25)
    prompt = invariant_attention(q, whole, tables, torch.tensor([0, context], dtype=torch.int32, device=DEVICE),
                                 lens, SCALE, window=WINDOW)
    close(prompt, oracle(q, *keys[0], torch.arange(context, device=DEVICE), WINDOW), attention=True)
    step = invariant_attention(q[-1:], dropped, tables, torch.tensor([0, 1], dtype=torch.int32, device=DEVICE),
                               lens, SCALE, window=WINDOW)
    torch.testing.assert_close(step, prompt[-1:], atol=0, rtol=0)


def test_without_a_window_every_key_counts() -> None:
    """The same cases with window=None agree with full causal attention (the default path is unchanged)."""
    kv_layer, tables, lens = paged_pool([70], KV_HEADS, HEAD_DIM, torch.float32)
    finite = kv_layer.nan_to_num()
    q = randn(1, HEADS, HEAD_DIM, seed=26)
    expected = oracle(q, *gather_kv(finite, tables[0], 70), torch.tensor([69], device=DEVICE), 10**6)
    close(paged_decode_attention_triton(q, kv_layer, tables, lens, SCALE), expected, attention=True)
    close(paged_decode_attention_ref(q, finite, tables, lens, SCALE), expected, attention=True)
