"""How many KV blocks (and window slots) an engine's pool has: `--kv-blocks`, else what its memory budget holds."""

import torch

from fleetctl.engine.core.block_allocator import blocks_for
from fleetctl.engine.core.engine_settings import EngineSettings
from fleetctl.engine.core.kv_cache import KVCacheSpec
from fleetctl.engine.core.kv_window import KVWindow
from fleetctl.engine.core.torch_devices import available_memory, kv_budget, total_memory


def pool_size(settings: EngineSettings, spec: KVCacheSpec, device: torch.device, memory_share: float,
              window: KVWindow | None) -> tuple[int, int]:
    """(blocks, window slots) of the pool: `num_kv_blocks`, else what the memory budget holds (`memory_share`: of its
    GPU's, for one of the workers sharing it). With windowed layers kept apart, the slots are what every sequence's
    window and a step's chunk need (no more than the blocks), and the global layers' blocks take the rest of the
    budget."""
    budget = (settings.num_kv_blocks or 0) * spec.bytes_per_block
    if not budget:
        gpu_total = total_memory(device) if device.type == "cuda" else None
        budget = kv_budget(available_memory(device), gpu_total, memory_share, settings.kv_memory_bytes)
    even = max(1, budget // spec.bytes_per_block)  # blocks holding every layer
    if window is None or not window.apart:
        return even, 0
    per_sequence = blocks_for(window.tokens + window.query_tile, spec.block_size) + 1
    wanted = settings.max_num_seqs * per_sequence + blocks_for(settings.max_num_batched_tokens, spec.block_size)
    slots = min(even, wanted)
    if settings.num_kv_blocks:
        return settings.num_kv_blocks, slots
    global_bytes = len(spec.global_layers) * spec.layer_bytes_per_block
    windowed_bytes = len(spec.windowed_layers) * spec.layer_bytes_per_block
    return max(1, (budget - slots * windowed_bytes) // global_bytes), slots
