"""Prefix caching without a model: the block manager's reference counts, cached blocks and LRU
eviction, and the scheduler reusing cached prefixes (the hash chain alone: test_block_hash.py).
Tokens are simulated the way the runner and the engine produce them (runner: num_cached_tokens =
num_tokens; engine: register the blocks that became full, then append the sampled token)."""

import contextlib
import dataclasses
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetctl.domain import Phase
from fleetctl.engine.core.block_allocator import BlockAllocator, OutOfBlocks, blocks_for
from fleetctl.engine.core.block_hash import KVSalt, Numerics, PrefixDigest, chain_hashes
from fleetctl.engine.core.block_manager import BlockManager
from fleetctl.engine.core.scheduler import Scheduler, SchedulerConfig
from fleetctl.engine.core.sequence import SamplingParams, Sequence, SequenceStatus

BLOCK = 4
SALT = KVSalt("weights:config", "bfloat16", Numerics.DETERMINISTIC, "cpu", "torch", "0.1.0", 1, BLOCK)
ROOT = SALT.root()


def make_scheduler(num_blocks: int = 64) -> Scheduler:
    return Scheduler(SchedulerConfig(block_size=BLOCK), BlockManager(num_blocks, BLOCK, ROOT))


def seq(tokens: list[int], request_id: str = "") -> Sequence:
    return Sequence(list(tokens), SamplingParams(max_tokens=64), request_id=request_id)


def run_step(sched: Scheduler, seqs: list[Sequence], token: int = 7) -> None:
    for s in seqs:
        before = s.num_cached_tokens
        s.num_cached_tokens = s.num_tokens
        sched.allocator.cache_full_blocks(s, before)
        s.output_token_ids.append(token)


def prefill(sched: Scheduler, *seqs: Sequence) -> None:
    for s in seqs:
        sched.add(s)
    step = sched.schedule()
    assert step is not None and step.phase is Phase.PREFILL and step.seqs == list(seqs)
    run_step(sched, step.seqs)


def live(sched: Scheduler) -> list[Sequence]:
    return [*sched.running, *sched.waiting, *sched.parked.values()]


def check_refs(sched: Scheduler) -> None:
    """Every block's reference count is the number of live block tables holding it; the rest is
    free or cached-unreferenced."""
    manager = sched.allocator
    held = Counter(b for s in live(sched) for b in s.block_table)
    assert all(manager.ref_count(block) == count for block, count in held.items())
    assert manager.num_used == len(held)
    assert manager.num_free + manager.num_used == manager.num_blocks


def tokens(n: int, start: int = 100) -> list[int]:
    return list(range(start, start + n))


def test_prompts_sharing_three_blocks_share_exactly_three() -> None:
    a = [*tokens(16), 1, 2, 3]
    b = [*tokens(12), 9, 9, 9, 9, 1, 2, 3]  # differs from a in the 4th block
    ha, hb = chain_hashes(ROOT, a, BLOCK), chain_hashes(ROOT, b, BLOCK)
    assert len(ha) == len(hb) == 4  # the partial 5th block has no hash
    assert ha[:3] == hb[:3] and ha[3] != hb[3]
    sched = make_scheduler()
    first = seq(a)
    prefill(sched, first)
    second = seq(b)
    prefill(sched, second)
    assert second.block_table[:3] == first.block_table[:3]
    assert not set(second.block_table[3:]) & set(first.block_table)
    assert all(sched.allocator.ref_count(block) == 2 for block in first.block_table[:3])
    check_refs(sched)


@pytest.mark.parametrize("change", [{"dtype": "float32"}, {"numerics": Numerics.FAST}])
def test_same_tokens_under_another_salt_share_no_block(change: dict) -> None:
    ids = tokens(6 * BLOCK + 1)
    other = dataclasses.replace(SALT, **change).root()
    assert not set(chain_hashes(ROOT, ids, BLOCK)) & set(chain_hashes(other, ids, BLOCK))
    manager = BlockManager(16, BLOCK, ROOT)
    prefill(Scheduler(SchedulerConfig(block_size=BLOCK), manager), seq(ids))
    assert len(manager.match(ids)) == 6
    assert manager.digest(100).cached_prefix_tokens(ids) == 6 * BLOCK
    # looked up under the other salt (a router hashing for an engine in the other mode): nothing
    assert manager.match(ids, chain_hashes(other, ids, BLOCK)) == []
    assert PrefixDigest(other, BLOCK, manager.digest(100).hashes).cached_prefix_tokens(ids) == 0


def test_released_blocks_stay_cached_and_a_new_sequence_reuses_them() -> None:
    sched = make_scheduler(num_blocks=8)
    a = seq(tokens(10))  # 2 full blocks + 2 tokens
    prefill(sched, a)
    blocks = list(a.block_table)
    sched.finish(a)
    manager = sched.allocator
    assert manager.num_used == 0 and manager.num_cached == 2 and manager.num_free == 8
    b = seq([*tokens(10), 1, 2, 3])
    sched.add(b)
    step = sched.schedule()
    assert step is not None and step.seqs == [b]
    assert b.block_table[:2] == blocks[:2]  # full blocks reused
    assert b.block_table[2] != blocks[2]  # the partly filled block was never registered
    assert b.num_cached_tokens == 2 * BLOCK
    assert manager.num_cached == 0
    check_refs(sched)


@pytest.mark.parametrize(("length", "hits"), [(3 * BLOCK, 2), (3 * BLOCK + 1, 3)])
def test_a_prompt_cached_whole_recomputes_its_last_block(length: int, hits: int) -> None:
    """At least the last token is computed (its logits are sampled), in a block no one else holds."""
    sched = make_scheduler()
    a = seq(tokens(length + 5))
    prefill(sched, a)
    for _ in range(5):
        run_step(sched, sched.schedule().seqs)
    b = seq(tokens(length))
    sched.add(b)
    sched.schedule()
    assert b.num_cached_tokens == hits * BLOCK
    assert b.block_table[:hits] == a.block_table[:hits]
    assert b.block_table[-1] not in a.block_table
    check_refs(sched)


def test_decode_registers_blocks_it_fills_so_the_next_turn_hits_them() -> None:
    sched = make_scheduler()
    turn1 = seq(tokens(6))
    prefill(sched, turn1)  # 7 tokens, 6 written: 1 full block
    assert len(sched.allocator.match(turn1.token_ids)) == 1
    for _ in range(6):  # 13 tokens, 12 written: 3 full blocks, the last two filled while decoding
        run_step(sched, sched.schedule().seqs)
    sched.finish(turn1)
    turn2 = seq([*turn1.token_ids, 1, 2, 3])
    sched.add(turn2)
    sched.schedule()
    assert turn2.num_cached_tokens == 3 * BLOCK
    assert turn2.num_tokens - turn2.num_cached_tokens == 4  # the unwritten last answer token + new text


def test_eviction_reclaims_least_recently_used_blocks_tail_first() -> None:
    sched = make_scheduler(num_blocks=6)
    a, b = seq([*tokens(2 * BLOCK, 100), 1]), seq([*tokens(2 * BLOCK, 500), 1])
    prefill(sched, a)
    sched.finish(a)  # a's 2 full blocks cached, its partial block freed
    prefill(sched, b)
    sched.finish(b)  # LRU order: a1 a0 b1 b0 (each chain tail first); 2 blocks in the free list
    manager = sched.allocator
    assert manager.num_cached == 4 and manager.num_free == 6
    a_blocks = manager.match(a.token_ids)
    taken = manager.allocate(3)  # the free list first, then the least recently used cached block
    assert taken[-1] == a_blocks[1]
    assert manager.match(a.token_ids) == a_blocks[:1] and len(manager.match(b.token_ids)) == 2
    taken += manager.allocate(1)
    assert taken[-1] == a_blocks[0]
    assert manager.match(a.token_ids) == [] and len(manager.match(b.token_ids)) == 2
    manager.free(taken)  # reclaimed blocks lost their hashes: back to the free list, not the cache
    assert manager.num_cached == 2 and manager.num_free == 6


def test_a_hit_makes_a_cached_block_recently_used() -> None:
    sched = make_scheduler(num_blocks=4)
    a, b = seq([*tokens(BLOCK, 100), 1]), seq([*tokens(BLOCK, 500), 1])
    prefill(sched, a, b)
    sched.finish(a)
    sched.finish(b)  # LRU: a0, b0
    again = seq([*tokens(BLOCK, 100), 2])
    prefill(sched, again)  # hits a0
    sched.finish(again)  # LRU: b0, a0
    manager = sched.allocator
    b0 = manager.match(b.token_ids)[0]
    assert manager.allocate(3)[-1] == b0  # two free blocks first, then the least recently used


def test_reference_counts_never_go_below_zero() -> None:
    sched = make_scheduler()
    a, b = seq(tokens(9)), seq([*tokens(9), 1])
    prefill(sched, a)
    prefill(sched, b)
    shared = a.block_table[:2]
    assert [sched.allocator.ref_count(x) for x in shared] == [2, 2]
    sched.finish(a)
    assert [sched.allocator.ref_count(x) for x in shared] == [1, 1]
    sched.finish(b)
    assert [sched.allocator.ref_count(x) for x in shared] == [0, 0]
    with pytest.raises(ValueError, match="freed twice"):
        sched.allocator.free(shared[:1])
    assert sched.allocator.ref_count(shared[0]) == 0
    assert sched.allocator.num_used == 0


def test_a_sequence_whose_blocks_a_batch_mate_computes_waits_one_step_and_reuses_them() -> None:
    """Parallel samples of one prompt (or a shared system prompt) arriving together: the prompt's full blocks
    are computed once; a sequence with other tokens behind them is not held up."""
    sched = make_scheduler(num_blocks=16)
    a, b, other = seq(tokens(9), "a"), seq(tokens(9), "b"), seq(tokens(9, 500), "other")
    for s in (a, b, other):
        sched.add(s)
    first = sched.schedule()
    assert first is not None and first.seqs == [a, other]
    run_step(sched, first.seqs)
    second = sched.schedule()
    assert second is not None and second.phase is Phase.PREFILL and second.seqs == [b]
    assert b.block_table[:2] == a.block_table[:2] and b.num_cached_tokens == 8  # only its last token computed
    check_refs(sched)


def test_two_sequences_registering_the_same_blocks_keep_one_copy() -> None:
    """Blocks computed twice (by two engines' worth of scheduling) register once; the copy is freed plainly."""
    sched = make_scheduler(num_blocks=8)
    a, b = seq(tokens(9), "a"), seq(tokens(9), "b")
    for s in (a, b):
        s.block_table = sched.allocator.allocate(3)
        run_step(sched, [s])
    a_blocks = list(a.block_table)
    sched.allocator.free(a.block_table)
    sched.allocator.free(b.block_table)
    assert sched.allocator.num_cached == 2  # a's two full blocks; b's copies went back to the free list
    assert sched.allocator.match(b.token_ids) == a_blocks[:2]


def test_a_preempted_sequence_recomputes_only_what_was_evicted() -> None:
    sched = make_scheduler(num_blocks=4)
    a, b = seq(tokens(7, 100), "a"), seq(tokens(7, 500), "b")
    prefill(sched, a, b)  # 8 tokens and 2 blocks each: the pool is full
    run_step(sched, sched.schedule().seqs)  # decode: 9 tokens each, both blocks of each full and cached
    step = sched.schedule()  # a needs a 3rd block: b (the latest) is preempted
    assert step is not None and step.seqs == [a]
    assert b.status is SequenceStatus.WAITING and b.num_cached_tokens == 0 and sched.num_preemptions == 1
    check_refs(sched)
    run_step(sched, step.seqs)
    sched.finish(a)
    step = sched.schedule()
    assert step is not None and step.seqs == [b]
    assert b.num_cached_tokens == BLOCK  # its head block outlived the preemption; a took its tail block
    check_refs(sched)


def test_caching_off_hands_out_exactly_the_free_lists_blocks() -> None:
    off, plain = BlockManager(6, BLOCK), BlockAllocator(6)
    for count, release in ((2, 0), (3, 2), (1, 0), (2, 1)):
        got = off.allocate(count)
        assert got == plain.allocate(count)
        if release:
            off.free(got[:release])
            plain.free(got[:release])
    assert off.num_free == plain.num_free and off.num_cached == 0


OPS = st.lists(st.tuples(st.sampled_from(["add", "adopt", "step", "finish", "park", "release_parked"]),
                         st.integers(0, 3), st.integers(1, 14)), max_size=60)


@settings(max_examples=60, deadline=None)
@given(ops=OPS, num_blocks=st.integers(4, 12))
def test_random_lifecycles_leak_no_block_and_no_reference(ops: list[tuple[str, int, int]], num_blocks: int) -> None:
    """Adds with shared prefixes, sequences adopted with their KV (a handoff or a restore: cached
    leading blocks reused), steps (prefill or decode, preemption under a small pool), finishes, parks
    and releases of parked sequences, in any order: reference counts always match the block tables,
    and once every sequence is gone every block is free or cached-unreferenced."""
    sched = make_scheduler(num_blocks)
    prefixes = [tokens(2 * BLOCK, 100), tokens(3 * BLOCK + 1, 300), tokens(BLOCK, 700), []]
    for op, which, length in ops:
        if op == "add":
            ids = prefixes[which] + tokens(length, 1000 + 50 * len(live(sched)))
            if blocks_for(len(ids) + 2) <= num_blocks:  # the engine caps a sequence at the pool
                sched.add(seq(ids))
        elif op == "adopt":
            adopted = seq(prefixes[which] + tokens(length, 2000 + 50 * len(live(sched))))
            adopted.output_token_ids.append(7)
            with contextlib.suppress(OutOfBlocks):  # as LLMEngine.adopt: reused blocks need no copy
                hits = sched.admit_prefilled(adopted)
                sched.allocator.cache_full_blocks(adopted, hits * BLOCK)
        elif op == "step" and (step := sched.schedule()) is not None:
            run_step(sched, step.seqs)
        elif op == "finish" and live(sched):
            sched.finish(live(sched)[which % len(live(sched))])
        elif op == "park" and sched.running:
            sched.park(sched.running[which % len(sched.running)])
        elif op == "release_parked" and sched.parked:
            sched.finish(list(sched.parked.values())[which % len(sched.parked)])
        check_refs(sched)
    for s in live(sched):
        sched.finish(s)
    manager = sched.allocator
    assert manager.num_used == 0 and manager.num_free == num_blocks
    assert manager.num_cached <= num_blocks


def test_a_hash_that_names_other_tokens_is_no_hit() -> None:
    """What a hash collision would look like: the right hashes for the wrong tokens. The block
    manager compares each cached block's tokens and parent, so it finds nothing."""
    sched = make_scheduler()
    ids = tokens(3 * BLOCK + 1)
    prefill(sched, seq(ids))
    manager = sched.allocator
    hashes = chain_hashes(ROOT, ids, BLOCK)
    assert len(manager.match(ids, hashes)) == 3
    forged = [*ids[:BLOCK], *ids[BLOCK : 2 * BLOCK][::-1], *ids[2 * BLOCK :]]
    assert len(manager.match(forged, hashes)) == 1  # stops at the block whose tokens differ
