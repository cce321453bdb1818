"""The seam between one engine's KV pool and the node-wide KV tiers (`kv_tiers`): a cached block the pool
reclaims goes to the tiers (its K/V copied out as bytes, written in the background) — or, write-through, each
block as soon as the pool registers it — and a prompt's leading
blocks the pool lacks but a tier holds are read back into pool blocks before the prompt is scheduled, so the
scheduler's prefix match finds them as if they had been computed here. The bytes are the pool's own, so a
block read back is bit-identical to the one written: deterministic mode's token identity holds through a tier.

A block's address is its hash chain digest, which names the model, dtype, numerics, KV layout and block size
(`block_hash.KVSalt`): an engine only ever finds blocks written under its own salt. The record's parent digest
and token ids are checked against the prompt's before a block is used, as a pool hit is.

With windowed layers kept apart (window_slots), a block whose window slot is gone holds only the global
layers' K/V: it is not offered (a record holds every layer), and a block read back gets a slot only if one is
free (else it serves only queries whose window starts after it)."""

import dataclasses
import sys
from collections import Counter, abc
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from fleetctl.engine.core.block_manager import CachedBlock
from fleetctl.engine.core.engine_settings import OffloadPolicy
from fleetctl.engine.core.kv_cache import KVCache
from fleetctl.engine.core.kv_tiers.block_file import TierBlock
from fleetctl.engine.core.kv_tiers.file_tier import FileTier, TierStats, tier_roots
from fleetctl.engine.core.kv_tiers.tiers import KVTiers
from fleetctl.engine.core.sequence import Sequence


def open_tiers(host_bytes: int, host_dir: Path | None, disk_dir: Path | None, disk_bytes: int) -> KVTiers | None:
    """The tiers the settings ask for (host memory over disk), or None for none."""
    roots = tier_roots(host_bytes, host_dir, disk_dir, disk_bytes)
    tiers = [FileTier(name, root, bound) for name, root, bound in roots]
    return KVTiers(tiers) if tiers else None


@dataclass(frozen=True)
class LoadedBlock:
    cached: CachedBlock  # what the pool registers it as (checked against the prompt on the reader thread)
    payload: bytes  # its K/V, the pool's bytes as written
    tier: str


TierRead = Future[list[LoadedBlock]]  # a prompt's leading blocks as read, in order, up to the first miss


class KVOffload:
    def __init__(self, tiers: KVTiers, kv_cache: KVCache, policy: OffloadPolicy = OffloadPolicy.EVICT) -> None:
        self.tiers = tiers
        self.kv_cache = kv_cache
        self.hits: Counter[str] = Counter()  # blocks read back, by tier name
        self.already_held = 0  # blocks offered that a tier held already: not copied out or written again
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="kv-tiers-reader")
        if policy is OffloadPolicy.WRITE_THROUGH:
            kv_cache.allocator.on_cached = self.offer
        else:
            kv_cache.allocator.on_reclaim = self.offer

    def offer(self, block: int, cached: CachedBlock) -> None:
        """`block` leaves the pool (or, write-through, is registered there): its K/V go to the tiers (copied
        now, written later), unless a tier holds it already."""
        if not self.kv_cache.has_window(block):
            return
        if self.tiers.touch(cached.block_hash):
            self.already_held += 1
            return
        kv = self.kv_cache.read_blocks([block])[:, :, 0]  # [layers, 2, block_size, kv_heads, head_dim]
        payload = kv.contiguous().view(torch.uint8).cpu().numpy().tobytes()
        self.tiers.offer(TierBlock(cached.block_hash, cached.parent, cached.tokens, payload))

    def io(self) -> dict[str, TierStats]:
        """Each tier's counts in this process so far (copies: the writer thread updates them)."""
        return {tier.name: dataclasses.replace(tier.stats) for tier in self.tiers.tiers}

    def start_read(self, token_ids: abc.Sequence[int], hashes: abc.Sequence[bytes]) -> TierRead | None:
        """Start reading the leading blocks of a prompt that the tiers hold and the pool does not, up to the first
        one missing everywhere; None when the tiers do not hold the first block the pool lacks (one stat per
        tier: nothing to wait for). `hashes`: the prompt's full blocks' chain, of which the block holding its
        last token is left out (that token is always computed)."""
        allocator, size = self.kv_cache.allocator, self.kv_cache.spec.block_size
        usable = list(hashes[: (len(token_ids) - 1) // size])
        start = len(allocator.match(token_ids, usable))
        if start == len(usable) or not self.tiers.holds(usable[start]):
            return None
        parent = usable[start - 1] if start else allocator.root
        expected = [CachedBlock(usable[i], usable[i - 1] if i > start else parent,
                                tuple(token_ids[i * size : (i + 1) * size])) for i in range(start, len(usable))]
        return self._reader.submit(self._read, expected)

    def _read(self, expected: list[CachedBlock]) -> list[LoadedBlock]:
        """On the reader thread: the blocks of `expected` the tiers hold, in order, each checked against it."""
        loaded = []
        for want, hit in zip(expected, self.tiers.lookup([block.block_hash for block in expected]), strict=False):
            if (hit.block.parent, hit.block.token_ids) != (want.parent, want.tokens):
                break
            loaded.append(LoadedBlock(want, hit.block.payload, hit.tier))
        return loaded

    def land(self, read: TierRead) -> dict[str, int]:
        """Copy a finished read into pool blocks, registered as cached (a block the pool registered meanwhile is
        kept as it is); stops where a block does not fit; a read that raised lands nothing. Returns the tokens
        read, by tier (and counts the blocks in `hits`)."""
        size = self.kv_cache.spec.block_size
        try:
            blocks = read.result()
        except Exception as exc:  # a read that fails is a miss, as a bad record is: the prompt is computed
            print(f"fleetctl: a KV tier read failed ({exc}): the prompt is computed", file=sys.stderr, flush=True)
            return {}
        read_tokens: Counter[str] = Counter()
        for block in blocks:
            if self.kv_cache.allocator.holds(block.cached.block_hash):
                continue
            if not self._load(block.cached, block.payload):
                break
            self.hits[block.tier] += 1
            read_tokens[block.tier] += size
        return dict(read_tokens)

    def _load(self, cached: CachedBlock, payload: bytes) -> bool:
        """`payload` into a fresh pool block registered as `cached`; False when it does not fit the layout or no
        block can be had."""
        spec = self.kv_cache.spec
        if len(payload) != spec.bytes_per_block:
            return False
        block = self.kv_cache.allocator.register_loaded(cached)
        if block is None:
            return False
        shape = (spec.num_layers, 2, 1, spec.block_size, spec.num_kv_heads, spec.row_width)
        self.kv_cache.write_blocks([block], torch.frombuffer(bytearray(payload), dtype=torch.uint8)
                                   .view(spec.storage_dtype).view(shape))
        return True


def take_tier_tokens(seqs: list[Sequence]) -> dict[str, dict[str, int]]:
    """What the tiers served each sequence at admission, once (taken off it): its first step reports it."""
    taken = {}
    for seq in seqs:
        if seq.tier_tokens:  # only at admission: a decode step passes over the rest
            taken[seq.request_id], seq.tier_tokens = seq.tier_tokens, {}
    return taken
