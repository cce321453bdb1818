"""The seam between one engine's KV pool and the node-wide tier store (`kv_tiers`): a cached block the pool
reclaims goes to the tiers (its K/V copied out as bytes, written in the background) — or, write-through, each
block as soon as the pool registers it — and a prompt's leading
blocks the pool lacks but a tier holds are read back into pool blocks before the prompt is scheduled, so the
scheduler's prefix match finds them as if they had been computed here. The bytes are the pool's own, so a
block read back is bit-identical to the one written: deterministic mode's token identity holds through a tier.

A block's address is its hash chain digest, which names the model, dtype, numerics, KV layout and block size
(`block_hash.KVSalt`): an engine only ever finds blocks written under its own salt. The record's parent digest
and token ids are checked against the prompt's before a block is used, as a pool hit is."""

import dataclasses
from collections import Counter, abc
from pathlib import Path

import torch

from fleetctl.engine.core.block_manager import CachedBlock
from fleetctl.engine.core.config import OffloadPolicy
from fleetctl.engine.core.kv_cache import KVCache
from fleetctl.engine.core.kv_tiers.block_file import TierBlock
from fleetctl.engine.core.kv_tiers.file_tier import FileTier, TierStats, tier_roots
from fleetctl.engine.core.kv_tiers.tiers import KVTiers


def open_tiers(host_bytes: int, host_dir: Path | None, disk_dir: Path | None, disk_bytes: int) -> KVTiers | None:
    """The tiers the settings ask for (host memory over disk), or None for none."""
    roots = tier_roots(host_bytes, host_dir, disk_dir, disk_bytes)
    tiers = [FileTier(name, root, bound) for name, root, bound in roots]
    return KVTiers(tiers) if tiers else None


class KVOffload:
    def __init__(self, tiers: KVTiers, kv_cache: KVCache, policy: OffloadPolicy = OffloadPolicy.EVICT) -> None:
        self.tiers = tiers
        self.kv_cache = kv_cache
        self.hits: Counter[str] = Counter()  # blocks read back, by tier name
        self.already_held = 0  # blocks offered that a tier held already: not copied out or written again
        if policy is OffloadPolicy.WRITE_THROUGH:
            kv_cache.allocator.on_cached = self.offer
        else:
            kv_cache.allocator.on_reclaim = self.offer

    def offer(self, block: int, cached: CachedBlock) -> None:
        """`block` leaves the pool (or, write-through, is registered there): its K/V go to the tiers (copied
        now, written later), unless a tier holds it already."""
        if self.tiers.touch(cached.block_hash):
            self.already_held += 1
            return
        kv = self.kv_cache.tensor[:, :, block].contiguous()  # [layers, 2, block_size, kv_heads, head_dim]
        payload = kv.view(torch.uint8).cpu().numpy().tobytes()
        self.tiers.offer(TierBlock(cached.block_hash, cached.parent, cached.tokens, payload))

    def io(self) -> dict[str, TierStats]:
        """Each tier's counts in this process so far (copies: the writer thread updates them)."""
        return {tier.name: dataclasses.replace(tier.stats) for tier in self.tiers.tiers}

    def fill(self, token_ids: abc.Sequence[int], hashes: abc.Sequence[bytes]) -> dict[str, int]:
        """Read the leading blocks of a prompt that the tiers hold and the pool does not into pool blocks,
        stopping at the first one missing everywhere; `hashes`: the prompt's full blocks' chain, of which the
        block holding its last token is left out (that token is always computed). Returns the tokens read, by
        tier (and counts the blocks in `hits`)."""
        allocator, size = self.kv_cache.allocator, self.kv_cache.spec.block_size
        usable = list(hashes[: (len(token_ids) - 1) // size])
        start = len(allocator.match(token_ids, usable))
        parent = usable[start - 1] if start else allocator.root
        read: Counter[str] = Counter()
        for i, hit in enumerate(self.tiers.lookup(usable[start:]), start):
            expected = CachedBlock(usable[i], parent, tuple(token_ids[i * size : (i + 1) * size]))
            if (hit.block.parent, hit.block.token_ids) != (expected.parent, expected.tokens):
                break
            if not self._load(expected, hit.block.payload):
                break
            self.hits[hit.tier] += 1
            read[hit.tier] += size
            parent = usable[i]
        return dict(read)

    def _load(self, cached: CachedBlock, payload: bytes) -> bool:
        """`payload` into a fresh pool block registered as `cached`; False when it does not fit the layout or no
        block can be had."""
        target = self.kv_cache.tensor[:, :, 0]
        if len(payload) != target.numel() * target.element_size():
            return False
        block = self.kv_cache.allocator.register_loaded(cached)
        if block is None:
            return False
        kv = torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(target.dtype).view(target.shape)
        self.kv_cache.tensor[:, :, block].copy_(kv)
        return True
