"""Continuous batching: decides which sequences run in the next step and owns their block tables.

Each step is either a prefill batch (new or preempted sequences, whole context at once) or a decode
batch (one token for every running sequence). When a decode step needs a block and none is free,
the most recently admitted sequence is preempted: its blocks are freed and it is recomputed later.

A sequence admitted for prefill takes the cached blocks of its longest cached prefix (see
block_manager) and computes only the rest — never less than its last token, whose logits are sampled
from: the reuse stops at the last full block *before* the one holding that token. A prompt cached
whole thus recomputes its last block (1 to 16 tokens) into a fresh block, rather than writing into a
block other sequences share.

Chunked prefill: a step computes at most `max_num_batched_tokens` prompt tokens. A prompt longer than
what is left of that budget is computed a chunk per step (its blocks are all allocated when it is
admitted; it sits in `prefilling` between chunks, and samples its first token only with its last
chunk). While a prompt is part-way through and sequences are decoding, prefill and decode steps
alternate, so one long prompt does not stall a mixed worker's decodes for its whole prefill.
Two waiting sequences that start with the same uncached blocks are not prefilled in one step: the second
waits a step and reuses what the first computed. A sequence whose prefix is being read off a KV tier
(`awaiting_tiers`) waits, and those queued behind it go ahead.

With a KV window (every layer windowed, kv_window), a sequence's leading blocks that no later step reads are
freed each time it is scheduled or admitted: its table keeps their places as DROPPED_BLOCK entries. When only
some layers are windowed (the window `apart`), blocks stay and their window slots go instead (window_holds):
each step's sequences hold slots for the blocks it writes, a prefill chunk cut short where slots run out and
a decode preempting for a slot as for a block.
"""

from collections import deque
from dataclasses import dataclass

from fleetctl.domain import Phase
from fleetctl.engine.core.block_allocator import OutOfBlocks, blocks_for
from fleetctl.engine.core.block_manager import BlockManager
from fleetctl.engine.core.kv_window import DROPPED_BLOCK, KVWindow
from fleetctl.engine.core.sequence import Sequence, SequenceStatus
from fleetctl.engine.core.window_holds import WindowHolds


@dataclass(frozen=True)
class SchedulerConfig:
    block_size: int
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 4096
    kv_window: KVWindow | None = None  # leading blocks (or, apart, their window slots) go as sequences grow
    session_ttl_s: float = 0.0  # a session's sequence leaves its cached blocks retained this long (agents)

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1 or self.block_size < 1:
            raise ValueError("scheduler limits must be positive")
        if self.session_ttl_s < 0:
            raise ValueError("the session TTL must be >= 0")


@dataclass
class ScheduledStep:
    phase: Phase
    seqs: list[Sequence]
    chunks: list[int]  # per sequence: tokens this step computes (a prefill chunk; 1 in decode)
    cache_hits: list[int]  # per sequence: prompt tokens its admission took from the prefix cache (else 0)

    def only(self, seq: Sequence) -> "ScheduledStep":
        """The same step for one of its sequences (a worker re-runs a failed step this way)."""
        i = self.seqs.index(seq)
        return ScheduledStep(self.phase, [seq], [self.chunks[i]], [self.cache_hits[i]])

    def completes(self, i: int) -> bool:
        """Whether sequence i samples a token this step (its prefill's last chunk, or a decode)."""
        seq = self.seqs[i]
        return seq.num_cached_tokens + self.chunks[i] >= seq.num_tokens


class Scheduler:
    def __init__(self, config: SchedulerConfig, allocator: BlockManager) -> None:
        self.config = config
        self.allocator = allocator
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.parked: dict[str, Sequence] = {}
        self.prefilling: list[Sequence] = []  # admitted, blocks held, prompt computed part-way (chunked)
        self.num_preemptions = 0
        self._decode_turn = False  # a chunk ran last: decodes go next
        # sequences moved here live since the last step: they decode first, alone, so a moved session's gap is the
        # wait for this worker's step boundary plus a step of one, not plus a whole batch's step
        self.arrived: list[Sequence] = []
        window = config.kv_window
        # the windowed layers' slots each sequence holds, when their K/V lives apart
        self.windows = WindowHolds(allocator, window) if window is not None and window.apart else None

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def schedule(self) -> ScheduledStep | None:
        arrived = [seq for seq in self.arrived if seq in self.running]
        self.arrived = []
        if arrived and (first := self._schedule_decode(arrived)):
            return first
        if self._decode_turn:
            self._decode_turn = False
            decode = self._schedule_decode()
            if decode:
                return decode
        prefill = self._schedule_prefill()
        if prefill:
            self._decode_turn = bool(self.prefilling and self.running)
            return prefill
        return self._schedule_decode()

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.prefilling or self.running)

    def finish(self, seq: Sequence) -> None:
        """Release a finished (or aborted) sequence's blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.prefilling:
            self.prefilling.remove(seq)
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
        if self.windows is not None:  # the slots the move wrote the windowed layers' K/V into are now its
            seq.window_table = [self.windows.slots.slot(block) for block in blocks]
        self._drop_passed(seq)  # blocks the source had dropped arrive unwritten: they go first
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        self.arrived.append(seq)

    def admit_prefilled(self, seq: Sequence, first_block: int = 0) -> int:
        """Take a sequence whose KV for all but its last token arrives from elsewhere, from its block
        `first_block` on (the source dropped those before): allocate its blocks and schedule it straight into
        decode. Returns the first block whose K/V must be copied in: those before came from the prefix cache
        or are dropped."""
        if len(self.running) >= self.config.max_num_seqs:
            raise OutOfBlocks(f"decode batch is full ({self.config.max_num_seqs} sequences)")
        hits = self._cached_prefix(seq)
        fresh = self._blocks(seq.num_tokens) - max(len(hits), first_block)
        seq.block_table = [DROPPED_BLOCK] * first_block + self.allocator.allocate(fresh, hits[first_block:])
        seq.num_dropped_blocks = first_block
        seq.num_cached_tokens = seq.num_tokens - 1
        self._drop_passed(seq)
        if self.windows is not None:
            if self.windows.reach(seq, seq.num_tokens) < seq.num_tokens:
                self._release(seq)
                raise OutOfBlocks("no window slots for its windowed layers' K/V")
            self.windows.hold(seq, seq.num_tokens)
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        return max(len(hits), seq.num_dropped_blocks)

    def _schedule_prefill(self) -> ScheduledStep | None:
        """Chunks of the prompts part-way through first, then new sequences, within the token budget."""
        step = ScheduledStep(Phase.PREFILL, [], [], [])
        budget = self.config.max_num_batched_tokens
        computing: set[bytes] = set()  # hashes of the full blocks this step computes
        for seq in list(self.prefilling):
            if budget == 0:
                break
            self._drop_passed(seq)
            chunk = self._window_reach(seq, min(budget, seq.num_tokens - seq.num_cached_tokens))
            if chunk:
                budget -= self._take(step, seq, chunk, 0, computing)
        deferred: list[Sequence] = []
        while budget and self.waiting and len(self.running) + len(self.prefilling) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if seq.awaiting_tiers:  # its prefix is still coming off a KV tier: those behind it go first
                deferred.append(self.waiting.popleft())
                continue
            hits = self._cached_prefix(seq)
            if self._computed_by_batch(seq, hits, computing):
                deferred.append(self.waiting.popleft())
                continue
            needed = self._blocks(seq.num_tokens) - len(hits)
            cached = len(hits) * self.config.block_size
            chunk = min(budget, seq.num_tokens - cached)
            if self.windows is not None:  # cut short where the window slots run out
                chunk = self.windows.admission_reach(hits, cached + chunk) - cached
            if chunk <= 0 or not self.allocator.can_allocate(needed, hits):
                break
            self.waiting.popleft()
            seq.block_table = self.allocator.allocate(needed, hits)
            seq.num_cached_tokens = cached
            self._drop_passed(seq)  # cached blocks the window has passed already
            seq.status = SequenceStatus.RUNNING
            self.prefilling.append(seq)
            budget -= self._take(step, seq, chunk, cached, computing)
        self.waiting.extendleft(reversed(deferred))
        return step if step.seqs else None

    def _take(self, step: ScheduledStep, seq: Sequence, chunk: int, cache_hit: int, computing: set[bytes]) -> int:
        """Put `chunk` tokens of `seq` in the step (noting the full blocks it computes); a sequence whose
        prompt this chunk completes runs."""
        step.seqs.append(seq)
        step.chunks.append(chunk)
        step.cache_hits.append(cache_hit)
        block = self.config.block_size
        start = seq.num_cached_tokens
        if self.windows is not None:
            self.windows.hold(seq, start + chunk)
        computing.update(self.allocator.block_hashes(seq)[start // block : (start + chunk) // block])
        if seq.num_cached_tokens + chunk >= seq.num_tokens:
            self.prefilling.remove(seq)
            self.running.append(seq)
        return chunk

    def _computed_by_batch(self, seq: Sequence, hits: list[int], computing: set[bytes]) -> bool:
        """Whether the first block `seq` would compute beyond its cached prefix is one a batch-mate computes
        (a sibling sample of the same prompt, a shared system prompt): it then waits one step and takes those
        blocks from the cache, rather than compute them a second time."""
        hashes = self.allocator.block_hashes(seq)  # none with prefix caching off
        reusable = min((seq.num_tokens - 1) // self.config.block_size, len(hashes))
        return len(hits) < reusable and hashes[len(hits)] in computing

    def _cached_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks for the longest cached prefix of `seq`, leaving its last token's block to compute."""
        hits = self.allocator.match(seq.token_ids, self.allocator.block_hashes(seq))
        hits = hits[: (seq.num_tokens - 1) // self.config.block_size]
        return hits if self.windows is None else self.windows.usable_prefix(hits)

    def _window_reach(self, seq: Sequence, chunk: int) -> int:
        """`chunk`, or as much of it as the window slots to be had now allow (windowed layers apart)."""
        if self.windows is None:
            return chunk
        start = seq.num_cached_tokens
        return self.windows.reach(seq, start + chunk) - start

    def _schedule_decode(self, seqs: list[Sequence] | None = None) -> ScheduledStep | None:
        """A decode step of the running sequences (or of `seqs`, some of them), each grown by a block where its
        next token needs one; a sequence that cannot grow preempts the youngest."""
        batch: list[Sequence] = []
        for seq in list(self.running if seqs is None else seqs):
            if seq not in self.running:  # preempted below to make room for an earlier one
                continue
            self._drop_passed(seq)  # before it grows: the block it frees may be the one it needs
            while (grow := self._blocks(seq.num_tokens) > len(seq.block_table)) or not self._window_reach(seq, 1):
                if grow and self.allocator.can_allocate(1):
                    seq.block_table += self.allocator.allocate(1)
                    continue
                victim = self.prefilling[-1] if self.prefilling else self.running[-1]
                self._preempt(victim)
                if victim is seq:
                    break
            if seq in self.running:
                if self.windows is not None:
                    self.windows.hold(seq, seq.num_tokens)
                batch.append(seq)
        for seq in batch:  # drafts only once every sequence's own token has its slot: a draft never preempts
            self._room_for_draft(seq)
        chunks = [1 + len(seq.draft_token_ids) for seq in batch]  # its token, and the draft it verifies
        return ScheduledStep(Phase.DECODE, batch, chunks, [0] * len(batch)) if batch else None

    def _room_for_draft(self, seq: Sequence) -> None:
        """Blocks for the slots of `seq`'s draft tokens, from free ones only: a draft is cut to what fits rather than
        preempt anything (and dropped where the K/V has a window: engine/core/speculation.py)."""
        if self.config.kv_window is not None:
            seq.draft_token_ids = []
            return
        short = self._blocks(seq.num_tokens + len(seq.draft_token_ids)) - len(seq.block_table)
        if short > 0:
            seq.block_table += self.allocator.allocate(min(short, self.allocator.num_free))
        room = len(seq.block_table) * self.config.block_size - seq.num_tokens
        seq.draft_token_ids = seq.draft_token_ids[:room]

    def trim(self, seq: Sequence) -> None:
        """Give back the blocks past what `seq`'s tokens need: those a rejected draft's slots took."""
        needed = self._blocks(seq.num_tokens)
        if len(seq.block_table) > needed:
            self.allocator.free(seq.block_table[needed:])
            del seq.block_table[needed:]

    def _preempt(self, seq: Sequence) -> None:
        (self.prefilling if seq in self.prefilling else self.running).remove(seq)
        self._release(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _release(self, seq: Sequence) -> None:
        if seq.block_table:
            retain = self.config.session_ttl_s if seq.session else 0.0
            windowed = self.windows.held_blocks(seq) if self.windows is not None else []
            self.allocator.free(seq.block_table[seq.num_dropped_blocks :], retain_s=retain, windowed=windowed)
        seq.block_table = []
        seq.window_table = []
        seq.num_dropped_blocks = 0
        seq.num_cached_tokens = 0

    def _drop_passed(self, seq: Sequence) -> None:
        """Free the leading blocks of `seq` that no step from its next token on reads (kv_window)."""
        window = self.config.kv_window
        if window is None:
            return
        if self.windows is not None:
            self.windows.pass_by(seq)
            return
        passed, dropped = window.passed_blocks(seq.num_cached_tokens), seq.num_dropped_blocks
        if passed > dropped:
            self.allocator.free(seq.block_table[dropped:passed])
            seq.block_table[dropped:passed] = [DROPPED_BLOCK] * (passed - dropped)
            seq.num_dropped_blocks = passed

    def _blocks(self, num_tokens: int) -> int:
        return blocks_for(num_tokens, self.config.block_size)
