"""The worker's paged KV pool: its shape, its tensor, and the block manager that owns its blocks."""

from dataclasses import dataclass

import torch

from fleetctl.engine.core.block_allocator import BLOCK_SIZE
from fleetctl.engine.core.block_manager import BlockManager
from fleetctl.engine.model.config import ModelConfig


@dataclass(frozen=True)
class KVCacheSpec:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    block_size: int = BLOCK_SIZE

    @classmethod
    def for_model(cls, config: ModelConfig, dtype: torch.dtype) -> "KVCacheSpec":
        return cls(config.num_layers, config.num_kv_heads, config.head_dim, dtype)

    @property
    def bytes_per_block(self) -> int:
        elem = torch.empty((), dtype=self.dtype).element_size()
        return self.num_layers * 2 * self.block_size * self.num_kv_heads * self.head_dim * elem


class KVCache:
    """The pool tensor [layers, 2, blocks, block_size, kv_heads, head_dim] and its block manager;
    `prefix_root` (block_hash.KVSalt.root) turns on prefix caching. With `scratch`, the tensor holds one
    block more than the manager hands out, `scratch_block`, which the compiled decode step's padding rows
    write to.

    Zero-initialised: masked attention multiplies unused slots by exactly 0, which must not meet NaN.
    """

    def __init__(
        self, spec: KVCacheSpec, num_blocks: int, device: torch.device, prefix_root: bytes | None = None,
        scratch: bool = False,
    ) -> None:
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        self.spec = spec
        self.scratch_block = num_blocks if scratch else None
        self.tensor = torch.zeros(
            spec.num_layers, 2, num_blocks + scratch, spec.block_size, spec.num_kv_heads, spec.head_dim,
            dtype=spec.dtype, device=device,
        )
        self.allocator = BlockManager(num_blocks, spec.block_size, prefix_root)

    @property
    def usage(self) -> float:
        return self.allocator.num_used / self.allocator.num_blocks
