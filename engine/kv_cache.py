"""The worker's paged KV pool and the allocator that owns its blocks."""

from collections import deque
from dataclasses import dataclass

import torch

from fleetctl.engine.model.config import ModelConfig

BLOCK_SIZE = 16
KV_LAYOUT_VERSION = 1  # [layers, 2, blocks, block_size, kv_heads, head_dim]


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

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)


class OutOfBlocks(RuntimeError):
    pass


class BlockAllocator:
    """Free-list allocator for the pool's block ids. Knows nothing about tensors."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._used)

    def can_allocate(self, count: int) -> bool:
        return count <= len(self._free)

    def allocate(self, count: int) -> list[int]:
        if count > len(self._free):
            raise OutOfBlocks(f"need {count} KV blocks, {len(self._free)} free")
        blocks = [self._free.popleft() for _ in range(count)]
        self._used.update(blocks)
        return blocks

    def free(self, blocks: list[int]) -> None:
        for block in blocks:
            if block not in self._used:
                raise ValueError(f"KV block {block} freed twice or never allocated")
            self._used.remove(block)
            self._free.append(block)


class KVCache:
    """The pool tensor [layers, 2, blocks, block_size, kv_heads, head_dim] and its allocator.

    Zero-initialised: masked attention multiplies unused slots by exactly 0, which must not meet NaN.
    """

    def __init__(self, spec: KVCacheSpec, num_blocks: int, device: torch.device) -> None:
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        self.spec = spec
        self.tensor = torch.zeros(
            spec.num_layers, 2, num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim,
            dtype=spec.dtype, device=device,
        )
        self.allocator = BlockAllocator(num_blocks)

    @property
    def usage(self) -> float:
        return self.allocator.num_used / self.allocator.num_blocks
