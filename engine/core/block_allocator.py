"""KV blocks as numbers: the block size, how many blocks a context needs, and the free-list allocator
that hands them out. Nothing here touches a tensor, so the controller can reason in blocks too."""

from collections import deque

from fleetctl.errors import FleetctlError

BLOCK_SIZE = 16
KV_LAYOUT_VERSION = 1  # pool layout [layers, 2, blocks, block_size, kv_heads, head_dim]


def blocks_for(num_tokens: int, block_size: int = BLOCK_SIZE) -> int:
    """Blocks that hold `num_tokens` tokens (the last one partly filled)."""
    return -(-num_tokens // block_size)


class OutOfBlocks(FleetctlError):
    pass


class BlockAllocator:
    """Hands out blocks in the order of a free list that starts as 0, 1, … num_blocks - 1 and takes freed
    blocks back at its end, without building that list: a small model on a big GPU has tens of millions of
    blocks. Blocks never handed out are a range (from a high-water mark); only freed ones are listed."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._never_used_from = 0  # blocks from here to num_blocks were never handed out
        self._returned: deque[int] = deque()  # freed blocks, oldest first: handed out after the never-used ones
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return self.num_blocks - self._never_used_from + len(self._returned)

    @property
    def num_used(self) -> int:
        return len(self._used)

    def can_allocate(self, count: int) -> bool:
        return count <= self.num_free

    def allocate(self, count: int) -> list[int]:
        if count > self.num_free:
            raise OutOfBlocks(f"need {count} KV blocks, {self.num_free} free")
        start = self._never_used_from
        self._never_used_from = min(self.num_blocks, start + count)
        blocks = list(range(start, self._never_used_from))
        blocks += [self._returned.popleft() for _ in range(count - len(blocks))]
        self._used.update(blocks)
        return blocks

    def free(self, blocks: list[int]) -> None:
        for block in blocks:
            if block not in self._used:
                raise ValueError(f"KV block {block} freed twice or never allocated")
            self._used.remove(block)
            self._returned.append(block)
