"""Who holds the KV pool's blocks, with automatic prefix caching. Torch-free: it owns block numbers,
never tensors, and decides nothing about sequences (the scheduler does).

Every block is in exactly one of three states:
- free: in the free list, its K/V worth nothing;
- referenced: held by one or more sequences (a reference count); a full block whose hash is
  registered can be held by several at once, since no sequence writes into a full block again;
- cached: unreferenced, its hash still registered and its K/V intact; kept in least-recently-used
  order and reclaimed (its hash forgotten) only when an allocation finds the free list empty.

A block gets its hash once it is full *and* written (`cache_full_blocks`, after every step): a
partly filled block is still being written and is never shared. With caching off (no salt root)
nothing is hashed, every released block goes straight back to the free list, and the blocks handed
out are exactly those the plain free list would hand out.

Released blocks enter the LRU order last block first, so a chain loses its tail before its head: a
block is only reachable through all the blocks before it. A block released with a retention (an agent
session's, `free(retain_s=…)`) is reclaimed only once its retention has run out, or when no other cached
block is left to reclaim.

Below the pool, the node-wide KV tiers (`kv_tiers`, wired by `kv_offload`) may keep what the pool lets go:
`on_reclaim` is told of each cached block just before it is reclaimed (its K/V still intact), `on_cached` of
each block as it is registered (full and written: write-through), and `register_loaded` takes a block for K/V
read back from a tier, registered and cached as if computed here.

For a model whose windowed layers keep their K/V apart (window_slots), the manager also owns those layers'
slots: `hold_window` gives a sequence's blocks slots as its window reaches them, `release_window` (and `free`'s
`windowed`) gives them back as the window passes; a registered block keeps its slot spare until slots run
short (offered to the tiers then, as if reclaimed) or the block is reclaimed.
"""

import time
from collections import OrderedDict, abc
from collections.abc import Callable
from dataclasses import dataclass

from fleetctl.engine.core.block_allocator import BLOCK_SIZE, BlockAllocator, OutOfBlocks
from fleetctl.engine.core.block_hash import PrefixDigest, chain_hashes
from fleetctl.engine.core.sequence import Sequence
from fleetctl.engine.core.window_slots import WindowSlots


@dataclass(frozen=True)
class CachedBlock:
    """A registered block's identity: its hash and the full preimage, checked on every hit."""

    block_hash: bytes
    parent: bytes
    tokens: tuple[int, ...]


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int = BLOCK_SIZE, root: bytes | None = None,
                 clock: Callable[[], float] = time.monotonic, window_slots: int = 0) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.root = root  # the salt's root digest (block_hash.KVSalt); None: prefix caching off
        self._free_list = BlockAllocator(num_blocks)  # referenced and cached blocks count as used there
        self._refs: dict[int, int] = {}
        self._by_hash: dict[bytes, int] = {}
        self._cached: dict[int, CachedBlock] = {}  # every registered block, referenced or not
        self._evictable: OrderedDict[int, None] = OrderedDict()  # registered and unreferenced, LRU first
        self._retained: dict[int, float] = {}  # evictable blocks kept until then (clock time) if others can go
        self.clock = clock  # monotonic seconds (retention); a test may set a fake one
        self.on_reclaim: Callable[[int, CachedBlock], None] | None = None  # a cached block about to be reused
        self.on_cached: Callable[[int, CachedBlock], None] | None = None  # a block just registered
        # the windowed layers' slots, when they keep their K/V apart (window_slots)
        self.window = WindowSlots(window_slots) if window_slots else None

    @property
    def num_free(self) -> int:
        """Blocks an allocation can have now: free ones and cached ones it may reclaim."""
        return self._free_list.num_free + len(self._evictable)

    @property
    def num_used(self) -> int:
        """Blocks held by at least one sequence."""
        return len(self._refs)

    @property
    def num_cached(self) -> int:
        """Unreferenced blocks kept for their K/V (counted in num_free too)."""
        return len(self._evictable)

    def ref_count(self, block: int) -> int:
        return self._refs.get(block, 0)

    def can_allocate(self, count: int, reuse: abc.Sequence[int] = ()) -> bool:
        """Whether `count` fresh blocks and the cached blocks `reuse` (from `match`) can be had now."""
        return count + sum(1 for block in reuse if block not in self._refs) <= self.num_free

    def allocate(self, count: int, reuse: abc.Sequence[int] = ()) -> list[int]:
        """Take a reference on each block of `reuse` and on `count` fresh blocks; returns them in that order."""
        if not self.can_allocate(count, reuse):
            raise OutOfBlocks(f"need {count} KV blocks, {self.num_free} free")
        for block in reuse:
            if block in self._refs:
                self._refs[block] += 1
            else:
                del self._evictable[block]
                self._retained.pop(block, None)
                self._refs[block] = 1
        fresh = [self._fresh() for _ in range(count)]
        return [*reuse, *fresh]

    def free(self, blocks: abc.Sequence[int], retain_s: float = 0.0, windowed: abc.Sequence[int] = ()) -> None:
        """Drop one reference on each block; an unreferenced block is cached if registered — and kept from
        reclaim for `retain_s` seconds while other cached blocks can go — else freed (into the free list in the
        given order, as without caching). `windowed`: those of them whose window slot the caller holds, released
        too (a cached block keeps its slot)."""
        if unheld := [block for block in blocks if block not in self._refs]:
            raise ValueError(f"KV blocks {unheld} freed twice or never allocated")
        if self.window is not None:
            for block in windowed:
                self.window.release(block, keep=block in self._cached)
        plain: list[int] = []
        for block in reversed(blocks):
            refs = self._refs[block]
            if refs > 1:
                self._refs[block] = refs - 1
                continue
            del self._refs[block]
            if block in self._cached:
                self._evictable[block] = None
                if retain_s > 0:
                    self._retained[block] = self.clock() + retain_s
            else:
                plain.append(block)
        self._free_list.free(plain[::-1])

    def window_room(self, taking: abc.Sequence[int] = ()) -> int:
        """Window slots `hold_window` can hand out now: free ones and spare ones (but `taking`'s, the cached
        blocks an allocation is about to hold)."""
        return 0 if self.window is None else self.window.num_free + self.window.spare(taking)

    def hold_window(self, blocks: abc.Sequence[int]) -> list[int]:
        """Hold a window slot for each of `blocks` (for the caller), giving one to each block without: a free
        slot, else the least recently released spare one. Returns the slots."""
        assert self.window is not None
        window = self.window
        slots = {block: window.hold(block) for block in window.slotted(blocks)}
        for block in blocks:
            if block not in slots:
                if not window.num_free:
                    self._reclaim_spare_slot()
                slots[block] = window.hold(block)
        return [slots[block] for block in blocks]

    def _reclaim_spare_slot(self) -> None:
        """Take back the least recently released spare slot: its block's windowed K/V leaves the pool, so the
        block, whole still, is offered as a reclaimed one is (the tiers keep records of every layer)."""
        assert self.window is not None
        if not self.window.spare():
            raise OutOfBlocks("no window slot free or spare")
        block = self.window.oldest_spare()
        cached = self._cached.get(block)
        if cached is not None and self.on_reclaim is not None:
            self.on_reclaim(block, cached)
        self.window.drop(block)

    def release_window(self, blocks: abc.Sequence[int]) -> None:
        """The caller's window has passed `blocks`: release its hold on their slots (a registered block's stays
        spare, another's goes back)."""
        assert self.window is not None
        for block in blocks:
            self.window.release(block, keep=block in self._cached)

    def block_hashes(self, seq: Sequence) -> list[bytes]:
        """`seq`'s hash chain over all its full blocks, extended in place as the sequence grows."""
        if self.root is not None and len(seq.block_hashes) < seq.num_tokens // self.block_size:
            seq.block_hashes = chain_hashes(self.root, seq.token_ids, self.block_size, seq.block_hashes)
        return seq.block_hashes

    def match(self, token_ids: abc.Sequence[int], hashes: abc.Sequence[bytes] | None = None) -> list[int]:
        """The cached blocks holding the longest run of `token_ids`' leading full blocks (none with
        caching off). `hashes`: their chain when known (`block_hashes`)."""
        if self.root is None:
            return []
        if hashes is None:
            hashes = chain_hashes(self.root, token_ids, self.block_size)
        blocks: list[int] = []
        parent = self.root
        for i, digest in enumerate(hashes):
            block = self._by_hash.get(digest)
            if block is None or self._cached[block] != CachedBlock(digest, parent, self._tokens(token_ids, i)):
                break
            blocks.append(block)
            parent = digest
        return blocks

    def cache_full_blocks(self, seq: Sequence, written_from: int) -> None:
        """Register the blocks of `seq` that became full with the tokens just written, positions
        `written_from` … `seq.num_cached_tokens - 1` (not those dropped: kv_window). A block whose hash is
        registered already (two sequences computed the same tokens in one step) stays unregistered and is freed
        as a plain block."""
        if self.root is None:
            return
        full = seq.num_cached_tokens // self.block_size
        first = max(written_from // self.block_size, seq.num_dropped_blocks)
        if first >= full:
            return
        hashes = self.block_hashes(seq)
        tokens = seq.token_ids
        for i in range(first, full):
            digest = hashes[i]
            if digest in self._by_hash:
                continue
            block = seq.block_table[i]
            parent = hashes[i - 1] if i else self.root
            self._by_hash[digest] = block
            self._cached[block] = cached = CachedBlock(digest, parent, self._tokens(tokens, i))
            if self.on_cached is not None:
                self.on_cached(block, cached)

    def holds(self, block_hash: bytes) -> bool:
        """Whether a block registered as `block_hash` is in the pool (referenced or cached)."""
        return block_hash in self._by_hash

    def register_loaded(self, cached: CachedBlock) -> int | None:
        """A block for K/V read back from a tier, registered as `cached` and unreferenced (the most recently
        used cached block, found by `match` like one computed here); None when its hash is registered already or
        no block is free or reclaimable. The caller writes the K/V into the block before the next step."""
        if self.root is None or cached.block_hash in self._by_hash or not self.num_free:
            return None
        block = self._fresh()
        del self._refs[block]
        self._by_hash[cached.block_hash] = block
        self._cached[block] = cached
        self._evictable[block] = None
        if self.window is not None and self.window.num_free:
            self.window.give(block)
        return block

    def digest(self, limit: int) -> PrefixDigest:
        """At most `limit` registered hashes: those of referenced blocks first, then the most recently used."""
        held = [info.block_hash for block, info in self._cached.items() if block in self._refs]
        recent = [self._cached[block].block_hash for block in reversed(self._evictable)]
        return PrefixDigest(self.root or b"", self.block_size, frozenset((held + recent)[:limit]))

    def _tokens(self, token_ids: abc.Sequence[int], index: int) -> tuple[int, ...]:
        return tuple(token_ids[index * self.block_size : (index + 1) * self.block_size])

    def _fresh(self) -> int:
        if self._free_list.num_free:
            block = self._free_list.allocate(1)[0]
        else:  # reclaim the least recently used cached block, a retained one last
            block = self._reclaimable()
            del self._evictable[block]
            self._retained.pop(block, None)
            cached = self._cached.pop(block)
            del self._by_hash[cached.block_hash]
            if self.on_reclaim is not None:
                self.on_reclaim(block, cached)
            if self.window is not None:
                self.window.drop(block)
        self._refs[block] = 1
        return block

    def _reclaimable(self) -> int:
        """The least recently used cached block whose retention (if any) has run out, else the least recently
        used one."""
        now = self.clock()
        oldest = next(iter(self._evictable))
        if not self._retained:
            return oldest
        return next((block for block in self._evictable if self._retained.get(block, 0.0) <= now), oldest)
