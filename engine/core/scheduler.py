"""Continuous batching: decides which sequences run in the next step and owns their block tables.

Each step is either a prefill batch (new or preempted sequences, whole context at once) or a decode
batch (one token for every running sequence). When a decode step needs a block and none is free,
the most recently admitted sequence is preempted: its blocks are freed and it is recomputed later.

A sequence admitted for prefill takes the cached blocks of its longest cached prefix (see
block_manager) and computes only the rest — never less than its last token, whose logits are sampled
from: the reuse stops at the last full block *before* the one holding that token. A prompt cached
whole thus recomputes its last block (1 to 16 tokens) into a fresh block, rather than writing into a
block other sequences share.
"""

from collections import deque
from dataclasses import dataclass

from fleetctl.engine.core.block_allocator import OutOfBlocks, blocks_for
from fleetctl.engine.core.block_manager import BlockManager
from fleetctl.engine.core.sequence import Sequence, SequenceStatus
from fleetctl.store.records import Phase


@dataclass(frozen=True)
class SchedulerConfig:
    block_size: int
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 4096

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1 or self.block_size < 1:
            raise ValueError("scheduler limits must be positive")


@dataclass
class ScheduledStep:
    phase: Phase
    seqs: list[Sequence]


class Scheduler:
    def __init__(self, config: SchedulerConfig, allocator: BlockManager) -> None:
        self.config = config
        self.allocator = allocator
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.parked: dict[str, Sequence] = {}
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def schedule(self) -> ScheduledStep | None:
        prefill = self._schedule_prefill()
        if prefill:
            return ScheduledStep(Phase.PREFILL, prefill)
        decode = self._schedule_decode()
        return ScheduledStep(Phase.DECODE, decode) if decode else None

    def finish(self, seq: Sequence) -> None:
        """Release a finished (or aborted) sequence's blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.parked.pop(seq.request_id, None)
        self._release(seq)
        seq.status = SequenceStatus.FINISHED

    def park(self, seq: Sequence) -> None:
        """Stop scheduling a prefilled sequence but keep its blocks (its KV awaits a handoff)."""
        self.running.remove(seq)
        seq.status = SequenceStatus.PARKED
        self.parked[seq.request_id] = seq

    def unpark(self, seq: Sequence) -> None:
        """Schedule a parked sequence again (a live move of it was called off)."""
        del self.parked[seq.request_id]
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    def admit_moved(self, seq: Sequence, blocks: list[int]) -> None:
        """Take a sequence moved here live, its K/V for all but its last token already in `blocks`
        (allocated to it): schedule it straight into decode."""
        if len(self.running) >= self.config.max_num_seqs:
            raise OutOfBlocks(f"decode batch is full ({self.config.max_num_seqs} sequences)")
        seq.block_table = blocks
        seq.num_cached_tokens = seq.num_tokens - 1
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    def admit_prefilled(self, seq: Sequence) -> int:
        """Take a sequence whose KV for all but its last token arrives from elsewhere: allocate its blocks
        and schedule it straight into decode. Returns how many leading blocks came from the prefix cache
        (their K/V need no copy)."""
        if len(self.running) >= self.config.max_num_seqs:
            raise OutOfBlocks(f"decode batch is full ({self.config.max_num_seqs} sequences)")
        hits = self._cached_prefix(seq)
        seq.block_table = self.allocator.allocate(self._blocks(seq.num_tokens) - len(hits), hits)
        seq.num_cached_tokens = seq.num_tokens - 1
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        return len(hits)

    def _schedule_prefill(self) -> list[Sequence]:
        batch: list[Sequence] = []
        tokens = 0
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            hits = self._cached_prefix(seq)
            needed = self._blocks(seq.num_tokens) - len(hits)
            cached = len(hits) * self.config.block_size
            computed = seq.num_tokens - cached
            over_budget = batch and tokens + computed > self.config.max_num_batched_tokens
            if over_budget or not self.allocator.can_allocate(needed, hits):
                break
            self.waiting.popleft()
            seq.block_table = self.allocator.allocate(needed, hits)
            seq.num_cached_tokens = cached
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            batch.append(seq)
            tokens += computed
        return batch

    def _cached_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks for the longest cached prefix of `seq`, leaving its last token's block to compute."""
        hits = self.allocator.match(seq.token_ids, self.allocator.block_hashes(seq))
        return hits[: (seq.num_tokens - 1) // self.config.block_size]

    def _schedule_decode(self) -> list[Sequence]:
        batch: list[Sequence] = []
        for seq in list(self.running):
            if seq not in self.running:  # preempted below to make room for an earlier one
                continue
            while self._blocks(seq.num_tokens) > len(seq.block_table):
                if self.allocator.can_allocate(1):
                    seq.block_table += self.allocator.allocate(1)
                    continue
                victim = self.running[-1]
                self._preempt(victim)
                if victim is seq:
                    break
            if seq in self.running:
                batch.append(seq)
        return batch

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _release(self, seq: Sequence) -> None:
        if seq.block_table:
            self.allocator.free(seq.block_table)
        seq.block_table = []
        seq.num_cached_tokens = 0

    def _blocks(self, num_tokens: int) -> int:
        return blocks_for(num_tokens, self.config.block_size)
