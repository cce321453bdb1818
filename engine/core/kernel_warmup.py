"""Compile every Triton kernel variant a worker will launch before it reports ready, instead of stalling
the first request (and later the first step of each new shape) on JIT compiles.

The warm-up runs the model's own eager forward — so exactly the kernels a real step selects — on dummy
batches, one per variant of the attention kernels (kernels/attention_launch: the ints that change
Triton's specialisation from step to step); the row-wise kernels have one variant per model, compiled
by any of those. Every dummy token sits at position 0 of the pool's scratch block (never allocated to a
sequence), and every block table points there only, so no real block is read or written.

With the torch references (a CPU worker, FLEET_KERNELS=torch) there is nothing to compile: skipped.
"""

from dataclasses import replace

import torch

from fleetctl.engine.core.kv_cache import KVCache
from fleetctl.engine.model.attention_batch import AttentionBatch
from fleetctl.engine.model.decoder import DecoderModel
from fleetctl.kernels import ops
from fleetctl.kernels.attention_launch import decode_representatives, prefill_representatives
from fleetctl.kernels.triton_support import Launch, recording_launches


def needs_kernel_warm_up(device: torch.device) -> bool:
    """Whether steps on `device` launch Triton kernels (which compile on first launch)."""
    return ops.backend(device) != "torch"


def warm_up_kernels(model: DecoderModel, kv_cache: KVCache, max_seqs: int, max_width: int, prefill: bool,
                    decode: bool) -> set[Launch]:
    """Launch each kernel variant of eager prefill and/or decode steps of up to `max_seqs` sequences whose
    block tables are up to `max_width` wide. Only the pool's scratch block (and window slot) is written.
    Returns the launches, by specialisation."""
    spec, device = kv_cache.spec, kv_cache.tensor.device
    if not needs_kernel_warm_up(device):
        return set()
    assert kv_cache.scratch_block is not None
    shapes = [(True, seqs, width) for seqs, width in prefill_representatives(max_seqs, max_width)] if prefill else []
    if decode:
        shapes += [(False, seqs, width) for seqs, width in decode_representatives(
            max_seqs, max_width, spec.block_size, spec.num_kv_heads, spec.head_dim, spec.dtype, device)]
    with recording_launches() as launched, torch.inference_mode():  # the runner's mode for eager steps
        for is_prefill, seqs, width in shapes:
            ids, positions, batch = _scratch_step(is_prefill, seqs, width, kv_cache.scratch_block, spec.block_size,
                                                  device)
            if kv_cache.scratch_slot is not None:  # the windowed layers kept apart: their scratch slot
                scratch = _scratch_step(is_prefill, seqs, width, kv_cache.scratch_slot, spec.block_size, device)[2]
                batch = replace(batch, window_slots=scratch.slots, window_tables=scratch.block_tables)
            model.forward(ids, positions, batch, kv_cache.layers)
    return launched


def _scratch_step(is_prefill: bool, seqs: int, width: int, scratch_block: int, block_size: int,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor, AttentionBatch]:
    """`seqs` sequences of one token each at the scratch block's first slot, their tables `width` scratch blocks
    wide: input_ids, positions [seqs] and the batch, with the dtypes the runner uses."""
    zeros = torch.zeros(seqs, dtype=torch.int64, device=device)
    batch = AttentionBatch(
        is_prefill=is_prefill,
        slots=torch.full((seqs,), scratch_block * block_size, dtype=torch.int64, device=device),
        block_tables=torch.full((seqs, width), scratch_block, dtype=torch.int32, device=device),
        context_lens=torch.ones(seqs, dtype=torch.int32, device=device),
        cu_seqlens_q=torch.arange(seqs + 1, dtype=torch.int32, device=device),
    )
    return zeros, zeros.clone(), batch
