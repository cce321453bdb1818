"""Compile every Triton kernel variant a worker will launch before it reports ready, instead of stalling
the first request (and later the first step of each new shape) on JIT compiles.

The warm-up runs the model's own eager forward — so exactly the kernels a real step selects — on dummy
batches, one per variant of the attention kernels (kernels/attention_launch: the ints that change
Triton's specialisation from step to step); the row-wise kernels have one variant per model, compiled
by any of those. Every dummy token sits at position 0 of the pool's scratch block (never allocated to a
sequence), and every block table points there only, so no real block is read or written.

With the torch references (a CPU worker, FLEET_KERNELS=torch) there is nothing to compile: skipped.
"""

import torch

from fleetctl.engine.model.decoder import AttentionBatch, DecoderModel
from fleetctl.kernels import ops
from fleetctl.kernels.attention_launch import decode_representatives, prefill_representatives
from fleetctl.kernels.triton_support import Launch, recording_launches


def needs_kernel_warm_up(device: torch.device) -> bool:
    """Whether steps on `device` launch Triton kernels (which compile on first launch)."""
    return ops.backend(device) != "torch"


def warm_up_kernels(model: DecoderModel, kv_cache: torch.Tensor, scratch_block: int, max_seqs: int, max_width: int,
                    prefill: bool, decode: bool) -> set[Launch]:
    """Launch each kernel variant of eager prefill and/or decode steps of up to `max_seqs` sequences whose
    block tables are up to `max_width` wide. kv_cache: [L, 2, blocks, block_size, Hkv, d]; only
    `scratch_block` is written. Returns the launches, by specialisation."""
    if not needs_kernel_warm_up(kv_cache.device):
        return set()
    _, _, _, block_size, num_kv_heads, head_dim = kv_cache.shape
    shapes = [(True, seqs, width) for seqs, width in prefill_representatives(max_seqs, max_width)] if prefill else []
    if decode:
        shapes += [(False, seqs, width) for seqs, width in decode_representatives(
            max_seqs, max_width, block_size, num_kv_heads, head_dim, kv_cache.dtype, kv_cache.device)]
    with recording_launches() as launched, torch.inference_mode():  # the runner's mode for eager steps
        for is_prefill, seqs, width in shapes:
            model.forward(*_scratch_step(is_prefill, seqs, width, scratch_block * block_size, scratch_block,
                                         kv_cache.device), kv_cache)
    return launched


def _scratch_step(is_prefill: bool, seqs: int, width: int, scratch_slot: int, scratch_block: int,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor, AttentionBatch]:
    """`seqs` sequences of one token each at the scratch slot, their tables `width` scratch blocks wide:
    input_ids, positions [seqs] and the batch, with the dtypes the runner uses."""
    zeros = torch.zeros(seqs, dtype=torch.int64, device=device)
    batch = AttentionBatch(
        is_prefill=is_prefill,
        slots=torch.full((seqs,), scratch_slot, dtype=torch.int64, device=device),
        block_tables=torch.full((seqs, width), scratch_block, dtype=torch.int32, device=device),
        context_lens=torch.ones(seqs, dtype=torch.int32, device=device),
        cu_seqlens_q=torch.arange(seqs + 1, dtype=torch.int32, device=device),
    )
    return zeros, zeros.clone(), batch
