"""KV blocks as numbers: the block size, how many blocks a context needs, and the free-list allocator
that hands them out. Nothing here touches a tensor, so the controller can reason in blocks too."""

from collections import deque

BLOCK_SIZE = 16
KV_LAYOUT_VERSION = 1  # pool layout [layers, 2, blocks, block_size, kv_heads, head_dim]


def blocks_for(num_tokens: int, block_size: int = BLOCK_SIZE) -> int:
    """Blocks that hold `num_tokens` tokens (the last one partly filled)."""
    return -(-num_tokens // block_size)


class OutOfBlocks(RuntimeError):
    pass


class BlockAllocator:
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
