"""The KV tiers under the workers' pools, node-wide: tiers (`FileTier`) from fastest to largest — host
memory, then disk — each bounded and LRU. A block goes in at the top; what the top evicts goes down a tier, and
what the bottom evicts is gone. A lookup walks a prompt's block digests in order and stops at the first block no
tier holds (a prefix is only useful whole); a block found below the top is copied up, so the next read of it
is the fast one.

Writes are asynchronous: `offer` queues the block for one writer thread and returns at once (a worker evicting
a block from its pool must not wait for a disk); a full queue drops the block, counted, as a tier that is
behind would. `flush` waits for what is queued (tests, and a worker that stops)."""

import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from fleetctl.engine.core.kv_tiers.block_file import TierBlock
from fleetctl.engine.core.kv_tiers.file_tier import FileTier

QUEUE_BLOCKS = 256  # blocks waiting for the writer thread before new ones are dropped


@dataclass(frozen=True)
class TierHit:
    block: TierBlock
    tier: str  # the name of the tier that held it


class KVTiers:
    def __init__(self, tiers: Sequence[FileTier], queue_blocks: int = QUEUE_BLOCKS) -> None:
        if not tiers:
            raise ValueError("the KV tiers need at least one tier")
        self.tiers = list(tiers)
        self.dropped = 0  # blocks offered while the writer was QUEUE_BLOCKS behind
        self._queue: queue.Queue[TierBlock | None] = queue.Queue(queue_blocks)
        self._writer = threading.Thread(target=self._write_loop, name="kv-tiers-writer", daemon=True)
        self._writer.start()

    def lookup(self, digests: Sequence[bytes]) -> list[TierHit]:
        """The blocks of the longest prefix of `digests` the tiers hold, in order, each from the fastest tier
        holding it (and copied up to the top tier when it came from below)."""
        hits = []
        for digest in digests:
            hit = self._find(digest)
            if hit is None:
                break
            hits.append(hit)
        return hits

    def _find(self, digest: bytes) -> TierHit | None:
        for level, tier in enumerate(self.tiers):
            block = tier.get(digest)
            if block is not None:
                if level > 0:
                    self._store(block)
                return TierHit(block, tier.name)
        return None

    def holds(self, digest: bytes) -> bool:
        """Whether a tier holds the block `digest` names (a stat each; the record is checked only when read)."""
        return any(digest in tier for tier in self.tiers)

    def touch(self, digest: bytes) -> bool:
        """Whether a tier holds the block `digest` names (refreshing its LRU place there): a block offered again —
        a restored checkpoint's, one read back and reclaimed again — need not be copied out of the pool."""
        return any(tier.touch(digest) for tier in self.tiers)

    def offer(self, block: TierBlock) -> bool:
        """Queue `block` for the top tier; False when the writer is too far behind (the block is dropped)."""
        try:
            self._queue.put_nowait(block)
        except queue.Full:
            self.dropped += 1
            return False
        return True

    def flush(self) -> None:
        """Return once every block offered so far is written (or dropped by its tiers)."""
        self._queue.join()

    def close(self) -> None:
        self.flush()
        self._queue.put(None)
        self._writer.join()

    def _write_loop(self) -> None:
        while (block := self._queue.get()) is not None:
            try:
                self._store(block)
            finally:
                self._queue.task_done()
        self._queue.task_done()

    def _store(self, block: TierBlock) -> None:
        """Put `block` in the top tier; each block a tier evicts goes to the next one down."""
        evicted = self.tiers[0].put(block)
        for tier in self.tiers[1:]:
            evicted = [spilled for digest, record in evicted for spilled in tier.put_record(digest, record)]
