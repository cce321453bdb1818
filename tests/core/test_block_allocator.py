"""The block allocator: the order of the plain free list (0 … n-1 first, then freed blocks in the order they
came back), kept without building the list, so a pool of tens of millions of blocks costs nothing to start."""

import random
import tracemalloc
from collections import deque

import pytest

from fleetctl.engine.core.block_allocator import BlockAllocator, OutOfBlocks


class EagerFreeList:
    """The order to keep: the whole free list, built at the start."""

    def __init__(self, num_blocks: int) -> None:
        self.free_list = deque(range(num_blocks))

    def allocate(self, count: int) -> list[int]:
        return [self.free_list.popleft() for _ in range(count)]

    def free(self, blocks: list[int]) -> None:
        self.free_list.extend(blocks)


def test_a_huge_pool_is_not_listed_at_the_start() -> None:
    tracemalloc.start()
    try:
        allocator = BlockAllocator(20_000_000)
        assert allocator.allocate(3) == [0, 1, 2]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # a listed free list of 20 M blocks is hundreds of MB
    assert allocator.num_free == 20_000_000 - 3 and allocator.num_used == 3


def test_blocks_come_in_the_free_lists_order() -> None:
    rng = random.Random(31)
    allocator, expected = BlockAllocator(40), EagerFreeList(40)
    held: list[int] = []
    for _ in range(2000):
        if held and rng.random() < 0.5:
            rng.shuffle(held)
            count = rng.randint(1, len(held))
            allocator.free(held[:count])
            expected.free(held[:count])
            del held[:count]
        elif allocator.num_free:
            count = rng.randint(1, allocator.num_free)
            blocks = allocator.allocate(count)
            assert blocks == expected.allocate(count)
            held += blocks
        assert allocator.num_free == len(expected.free_list) and allocator.num_used == len(held)


def test_too_many_blocks_or_a_double_free_is_refused() -> None:
    allocator = BlockAllocator(4)
    blocks = allocator.allocate(3)
    assert not allocator.can_allocate(2)
    with pytest.raises(OutOfBlocks):
        allocator.allocate(2)
    allocator.free(blocks[:1])
    with pytest.raises(ValueError, match="freed twice"):
        allocator.free(blocks[:1])
    with pytest.raises(ValueError, match="never allocated"):
        allocator.free([3])
    assert allocator.allocate(2) == [3, blocks[0]]
