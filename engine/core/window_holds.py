"""Which window slots each sequence holds, for a model whose windowed layers keep their K/V apart
(window_slots): the scheduler's side of that pool. Torch-free.

A sequence holds the slots of its blocks from the first its window still covers
(`KVWindow.passed_blocks(num_cached_tokens)`) to the last the step about to run writes: a prefill chunk's
blocks are given slots as the chunk is scheduled, not when the prompt is admitted, so a prompt longer than the
slot pool still runs a chunk at a time. `seq.window_table` lists the slots by block (NO_SLOT before the window
and past what it holds), which the runner turns into the windowed layers' block tables.
"""

from fleetctl.engine.core.block_allocator import OutOfBlocks, blocks_for
from fleetctl.engine.core.block_manager import BlockManager
from fleetctl.engine.core.kv_window import KVWindow
from fleetctl.engine.core.sequence import Sequence
from fleetctl.engine.core.window_slots import NO_SLOT


class WindowHolds:
    def __init__(self, allocator: BlockManager, window: KVWindow) -> None:
        assert allocator.window is not None
        self.allocator = allocator
        self.slots = allocator.window
        self.window = window
        self.block_size = allocator.block_size

    def usable_prefix(self, hits: list[int]) -> list[int]:
        """The longest head of a cached prefix `hits` whose blocks within the next query's window all still have
        their slots (a cached block may have given its slot up: its windowed layers' K/V is gone)."""
        count = len(hits)
        while count:
            covered = range(self.window.passed_blocks(count * self.block_size), count)
            missing = [i for i in covered if self.slots.slot(hits[i]) == NO_SLOT]
            if not missing:
                break
            count = missing[-1]
        return hits[:count]

    def pass_by(self, seq: Sequence) -> None:
        """Release the slots of `seq`'s blocks its window has passed (a slot nobody holds goes back)."""
        table = seq.window_table
        held = []  # what it holds is one run of blocks: those of it the window passed since the last call
        for index in range(min(self.window.passed_blocks(seq.num_cached_tokens), len(table)) - 1, -1, -1):
            if table[index] == NO_SLOT:
                break
            held.append(index)
        if held:
            self.allocator.release_window([seq.block_table[i] for i in held])
            for i in held:
                seq.window_table[i] = NO_SLOT

    def reach(self, seq: Sequence, end: int) -> int:
        """How far (in tokens, at most `end`) `seq` can compute from its `num_cached_tokens` with the slots to be
        had now."""
        first, last = self._first_unheld(seq), blocks_for(end, self.block_size)
        room = self.allocator.window_room(seq.block_table[first:last])
        for index in range(first, last):
            if not self._has_slot(seq, index):
                if not room:
                    return min(end, index * self.block_size)
                room -= 1
        return end

    def admission_reach(self, hits: list[int], end: int) -> int:
        """How far (in tokens, at most `end`) a prompt admitted with the cached blocks `hits` (`usable_prefix`)
        can compute in its first step with the slots to be had now."""
        room = self.allocator.window_room(hits)
        return min(end, (len(hits) + room) * self.block_size)

    def hold(self, seq: Sequence, end: int) -> None:
        """Hold slots for `seq`'s blocks through token `end` - 1 (those its window covers); `reach` said they
        can be had."""
        table = seq.window_table
        table += [NO_SLOT] * (len(seq.block_table) - len(table))
        first = self._first_unheld(seq)
        last = blocks_for(end, self.block_size)
        if first < last:
            table[first:last] = self.allocator.hold_window(seq.block_table[first:last])

    def hold_received(self, reserved: list[int], end: int) -> None:
        """A live move's destination has written blocks up to `end` - 1 of `reserved` (the sequence's table, not yet
        a sequence's): hold slots for those the sequence's window may still cover and give back the rest, held for
        the reservation until `attach` hands them on. Raises OutOfBlocks when the slots cannot be had."""
        passed = self.window.passed_blocks(end * self.block_size)  # it has all these tokens: no earlier window
        self.allocator.release_window(self.slots.slotted(reserved[:passed]))
        unslotted = [block for block in reserved[passed:end] if self.slots.slot(block) == NO_SLOT]
        if len(unslotted) > self.allocator.window_room():
            raise OutOfBlocks(f"needs {len(unslotted)} window slots, {self.allocator.window_room()} to be had")
        self.allocator.hold_window(unslotted)

    def held_blocks(self, seq: Sequence) -> list[int]:
        """The blocks whose slots `seq` holds (to release with them)."""
        return [block for block, slot in zip(seq.block_table, seq.window_table, strict=False) if slot != NO_SLOT]

    def _first_unheld(self, seq: Sequence) -> int:
        """The first block from the window's start on that `seq` holds no slot for."""
        first = self.window.passed_blocks(seq.num_cached_tokens)
        table = seq.window_table
        while first < len(table) and table[first] != NO_SLOT:
            first += 1
        return first

    def _has_slot(self, seq: Sequence, index: int) -> bool:
        return index < len(seq.block_table) and self.slots.slot(seq.block_table[index]) != NO_SLOT
