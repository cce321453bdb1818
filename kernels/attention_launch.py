"""How the paged attention kernels' launches follow a step's shape (decode's tiles and split-K partition),
and one representative shape per variant Triton compiles them in: what a worker's warm-up runs.

The ints of a launch that change from step to step are what matters (`triton_support.int_class`): the
block table's width (passed as its stride), prefill's number of sequences, decode's split count and
partition; everything else is fixed by the model, the dtype and the device.
"""

import torch

from fleetctl.kernels.triton_support import first_of_each_class, int_class, interpreting, next_pow2, sm_count


def decode_tiles(dtype: torch.dtype, head_dim: int) -> tuple[int, int]:
    """(BLOCK_N, num_warps): tiles without register spills on sm_90 (ptxas -v); the interpreter prefers few
    large ones."""
    if interpreting():
        return 64, 4
    return (32, 8) if dtype == torch.float32 else (128, 4) if head_dim <= 64 else (64, 8)


def _split_cap(batch: int, num_kv_heads: int, device: torch.device) -> int:
    """The most split-K programs per (sequence, KV head) worth launching: enough to fill the GPU twice
    over; 1 (no split) off CUDA."""
    if device.type != "cuda":
        return 1
    return -(-2 * sm_count(device.index or 0) // max(1, batch * num_kv_heads))


def decode_partition(batch: int, num_kv_heads: int, max_len: int, block_n: int, device: torch.device) -> int:
    """Keys per split-K program, each split with >= 256 keys."""
    if device.type != "cuda":
        return max_len
    splits = min(_split_cap(batch, num_kv_heads, device), -(-max_len // 256))
    return -(-max_len // max(splits, 1) // block_n) * block_n


def decode_representatives(
    max_batch: int, max_width: int, page: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
    device: torch.device,
) -> list[tuple[int, int]]:  # fmt: skip
    """One (batch, block table width) per specialisation the decode kernels compile for a step of up to
    `max_batch` sequences whose tables are up to `max_width` blocks wide (what a warm-up runs). What varies
    from step to step: the table width (its stride), the split count and the partition."""
    block_n = decode_tiles(dtype, head_dim)[0]
    batches: dict[int, int] = {}  # batches that split alike: the first of each
    for batch in range(1, max_batch + 1):
        batches.setdefault(_split_cap(batch, num_kv_heads, device), batch)
    chosen: dict[tuple[str, ...], tuple[int, int]] = {}
    for batch in batches.values():
        for width in range(1, max_width + 1):
            max_len = width * page
            partition = decode_partition(batch, num_kv_heads, max_len, block_n, device)
            num_splits = -(-max_len // partition)
            key = (int_class(width), int_class(num_splits), int_class(partition), str(next_pow2(num_splits)))
            chosen.setdefault(key, (batch, width))
    return list(chosen.values())


def prefill_representatives(max_seqs: int, max_width: int) -> list[tuple[int, int]]:
    """One (sequences, block table width) per specialisation the prefill kernel compiles: the two ints
    that vary from step to step are the number of sequences and the table width (its stride)."""
    return [(seqs, width) for seqs in first_of_each_class(max_seqs) for width in first_of_each_class(max_width)]
