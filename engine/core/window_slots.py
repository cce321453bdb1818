"""The windowed layers' own pool, for a model whose other layers attend to every key (Gemma 3, Qwen2 with
`max_window_layers`): block numbers, never tensors (core/kv_cache owns those).

Such a model's blocks hold the global layers' K/V for as long as a sequence lives, but its windowed layers
read only the last `window` keys. Their K/V lives in slots of a smaller pool: a block has a slot while some
sequence's window still covers it (the sequence *holds* it), and gives it back when every holder's window has
passed (kv_window.KVWindow.passed_blocks). So a decode worker's windowed K/V stays bounded however long its
sequences grow, while the global layers keep every block.

A slot outlives its holders when its block is registered in the prefix cache: a later prompt that reuses the
block within its window needs that K/V. Such *spare* slots are taken back, least recently released first, when
slots run short (`BlockManager.hold_window`) or the block itself is reclaimed.
"""

from collections import OrderedDict
from collections.abc import Iterable

from fleetctl.engine.core.block_allocator import BlockAllocator

NO_SLOT = -1  # a block-table entry of a sequence's window table: no window K/V (passed, or not yet written)


class WindowSlots:
    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError("the windowed layers' pool needs at least one slot")
        self.num_slots = num_slots
        self._slots = BlockAllocator(num_slots)
        self._slot_of: dict[int, int] = {}  # block -> its slot
        self._holders: dict[int, int] = {}  # block -> sequences (or a move's reservation) whose window covers it
        self._spare: OrderedDict[int, None] = OrderedDict()  # slotted blocks nobody holds, least recently first

    @property
    def num_free(self) -> int:
        return self._slots.num_free

    @property
    def num_held(self) -> int:
        """Slots some sequence's window covers (what a worker's running sequences need)."""
        return self._slots.num_used - len(self._spare)

    def slot(self, block: int) -> int:
        """`block`'s slot, or NO_SLOT."""
        return self._slot_of.get(block, NO_SLOT)

    def slotted(self, blocks: Iterable[int]) -> list[int]:
        """Those of `blocks` that have a slot."""
        return [block for block in blocks if block in self._slot_of]

    def spare(self, excluding: Iterable[int] = ()) -> int:
        """Slots nobody holds (kept for their cached K/V), but those of `excluding`."""
        return len(self._spare) - sum(1 for block in set(excluding) if block in self._spare)

    def hold(self, block: int) -> int:
        """One more holder for `block`'s slot, which it gets now if it has none (a slot must be free)."""
        slot = self._slot_of.get(block)
        if slot is None:
            slot = self._slot_of[block] = self._slots.allocate(1)[0]
        self._spare.pop(block, None)
        self._holders[block] = self._holders.get(block, 0) + 1
        return slot

    def give(self, block: int) -> int:
        """A spare slot for `block` (K/V read back from a tier into a cached block); one must be free."""
        slot = self._slot_of[block] = self._slots.allocate(1)[0]
        self._spare[block] = None
        return slot

    def release(self, block: int, keep: bool) -> None:
        """One holder fewer for `block`; with none left its slot is kept spare (`keep`: its K/V is cached) or
        goes back."""
        holders = self._holders[block] - 1
        if holders:
            self._holders[block] = holders
            return
        del self._holders[block]
        if keep:
            self._spare[block] = None
        else:
            self._slots.free([self._slot_of.pop(block)])

    def drop(self, block: int) -> None:
        """Take back `block`'s slot, if it has one (nobody holds it: the block itself is reclaimed)."""
        if block in self._holders:
            raise ValueError(f"KV block {block}'s window slot is still held")
        self._spare.pop(block, None)
        slot = self._slot_of.pop(block, None)
        if slot is not None:
            self._slots.free([slot])

    def oldest_spare(self) -> int:
        """The block whose spare slot was released least recently: the first to give it back."""
        return next(iter(self._spare))
