"""Scheduler + BlockManager (prefix caching off here: tests/core/test_prefix_cache.py has it on) without a model:
tokens are simulated the way the runner and engine produce them (runner: num_cached_tokens = num_tokens;
engine: append the sampled token)."""

import pytest

from fleetctl.domain import Phase
from fleetctl.engine.core.block_allocator import BlockAllocator, OutOfBlocks
from fleetctl.engine.core.block_manager import BlockManager
from fleetctl.engine.core.kv_window import KVWindow
from fleetctl.engine.core.scheduler import ScheduledStep, Scheduler, SchedulerConfig
from fleetctl.engine.core.sequence import SamplingParams, Sequence, SequenceStatus

BLOCK = 4


def make_scheduler(num_blocks: int = 64, **limits: int) -> Scheduler:
    return Scheduler(SchedulerConfig(block_size=BLOCK, **limits), BlockManager(num_blocks, BLOCK))


def seq(num_prompt: int, request_id: str = "") -> Sequence:
    return Sequence(list(range(1, num_prompt + 1)), SamplingParams(max_tokens=64), request_id=request_id)


def run_step(sched: Scheduler, seqs: list[Sequence], token: int = 7) -> None:
    """What the runner and engine do after a step: the K/V of every token is cached, one token is sampled."""
    for s in seqs:
        s.num_cached_tokens = s.num_tokens
        s.output_token_ids.append(token)


def all_blocks(sched: Scheduler) -> list[int]:
    seqs = [*sched.running, *sched.waiting, *sched.parked.values()]
    return [b for s in seqs for b in s.block_table]


def test_config_rejects_non_positive_limits() -> None:
    for bad in (
        {"block_size": 0},
        {"block_size": 4, "max_num_seqs": 0},
        {"block_size": 4, "max_num_batched_tokens": 0},
    ):
        with pytest.raises(ValueError, match="positive"):
            SchedulerConfig(**bad)


def test_prefill_allocates_ceil_tokens_over_block_size() -> None:
    sched = make_scheduler()
    seqs = [seq(n) for n in (1, 4, 5, 9)]
    for s in seqs:
        sched.add(s)
    step = sched.schedule()
    assert step is not None
    assert step.phase is Phase.PREFILL
    assert step.seqs == seqs
    assert [len(s.block_table) for s in seqs] == [1, 1, 2, 3]
    assert sched.allocator.num_used == 7
    assert len(set(all_blocks(sched))) == 7  # no block handed out twice
    assert all(s.status is SequenceStatus.RUNNING and s.num_cached_tokens == 0 for s in seqs)
    assert sched.running == seqs
    assert not sched.waiting


def test_prefill_fills_the_token_budget_with_a_chunk_of_the_next_prompt() -> None:
    sched = make_scheduler(max_num_batched_tokens=10)
    a, b, c, d = seq(4), seq(5), seq(2), seq(1)
    for s in (a, b, c, d):
        sched.add(s)
    step = sched.schedule()
    assert step is not None and step.phase is Phase.PREFILL
    assert step.seqs == [a, b, c] and step.chunks == [4, 5, 1]  # 4 + 5 = 9: one token of c fits
    assert [step.completes(i) for i in range(3)] == [True, True, False]
    assert sched.running == [a, b] and sched.prefilling == [c]
    assert list(sched.waiting) == [d] and d.block_table == []


def test_prefill_budget_is_inclusive() -> None:
    sched = make_scheduler(max_num_batched_tokens=10)
    a, b = seq(4), seq(6)
    sched.add(a)
    sched.add(b)
    step = sched.schedule()
    assert step is not None and step.seqs == [a, b]


def run_chunks(step: ScheduledStep, token: int = 7) -> None:
    """What the runner and engine do after a chunked step: each chunk's K/V is cached, and a sequence
    whose prompt is complete samples a token."""
    for i, s in enumerate(step.seqs):
        complete = step.completes(i)
        s.num_cached_tokens += step.chunks[i]
        if complete:
            s.output_token_ids.append(token)


def test_a_prompt_longer_than_the_budget_is_prefilled_in_chunks() -> None:
    sched = make_scheduler(max_num_batched_tokens=8)
    big, small = seq(20), seq(1)
    sched.add(big)
    sched.add(small)
    step = sched.schedule()
    assert step is not None and step.seqs == [big] and step.chunks == [8] and not step.completes(0)
    assert len(big.block_table) == 5  # every block of the prompt, at admission
    assert sched.prefilling == [big] and list(sched.waiting) == [small]
    run_chunks(step)
    step = sched.schedule()  # the rest of the budget goes to the next chunk first, then to small
    assert step is not None and step.seqs == [big] and step.chunks == [8]
    run_chunks(step)
    step = sched.schedule()
    assert step.seqs == [big, small] and step.chunks == [4, 1] and step.completes(0) and step.completes(1)
    run_chunks(step)
    assert big.output_token_ids == [7] and sched.running == [big, small] and not sched.prefilling


def test_decodes_alternate_with_the_chunks_of_a_long_prompt() -> None:
    sched = make_scheduler(max_num_batched_tokens=8)
    short = seq(3)
    sched.add(short)
    run_chunks(sched.schedule())
    long = seq(30)
    sched.add(long)
    phases = []
    while not long.output_token_ids:
        step = sched.schedule()
        phases.append((step.phase, step.seqs[0]))
        run_chunks(step)
    assert phases == [(Phase.PREFILL, long), (Phase.DECODE, short)] * 3 + [(Phase.PREFILL, long)]


def test_a_part_prefilled_prompt_is_preempted_before_a_decoding_one() -> None:
    sched = make_scheduler(num_blocks=4, max_num_batched_tokens=4)
    a = seq(4)
    sched.add(a)
    run_chunks(sched.schedule())  # a: 5 tokens, needs a 2nd block to decode
    b = seq(12)  # 3 blocks: the rest of the pool
    sched.add(b)
    step = sched.schedule()
    assert step.seqs == [b] and sched.prefilling == [b]
    run_chunks(step)
    step = sched.schedule()  # a's decode needs a block: b, part-way, gives its blocks back
    assert step.phase is Phase.DECODE and step.seqs == [a]
    assert list(sched.waiting) == [b] and b.num_cached_tokens == 0 and b.block_table == []


def test_finish_releases_a_part_prefilled_prompt() -> None:
    sched = make_scheduler(max_num_batched_tokens=4)
    big = seq(12)
    sched.add(big)
    run_chunks(sched.schedule())
    sched.finish(big)
    assert not sched.prefilling and not sched.has_unfinished() and sched.allocator.num_used == 0


def test_prefill_stops_at_max_num_seqs_counting_running() -> None:
    sched = make_scheduler(max_num_seqs=3)
    seqs = [seq(2) for _ in range(5)]
    for s in seqs:
        sched.add(s)
    step = sched.schedule()
    assert step is not None and step.seqs == seqs[:3]
    assert list(sched.waiting) == seqs[3:]
    run_step(sched, step.seqs)
    # the batch is full: the next step decodes the running ones instead of prefilling more
    step = sched.schedule()
    assert step is not None and step.phase is Phase.DECODE and step.seqs == seqs[:3]
    sched.finish(seqs[0])
    step = sched.schedule()
    assert step is not None and step.phase is Phase.PREFILL and step.seqs == [seqs[3]]


def test_prefill_waits_for_blocks_in_fifo_order() -> None:
    sched = make_scheduler(num_blocks=3)
    a, b, c = seq(8), seq(8), seq(1)  # a takes 2 blocks, b needs 2 but only 1 is left
    for s in (a, b, c):
        sched.add(s)
    step = sched.schedule()
    assert step is not None and step.seqs == [a]  # c fits but does not jump the queue ahead of b
    assert list(sched.waiting) == [b, c]
    assert sched.allocator.num_free == 1


def test_decode_only_when_nothing_can_be_prefilled() -> None:
    sched = make_scheduler()
    a = seq(3)
    sched.add(a)
    assert sched.schedule().phase is Phase.PREFILL
    run_step(sched, [a])
    b = seq(3)
    sched.add(b)
    step = sched.schedule()
    assert step is not None and step.phase is Phase.PREFILL and step.seqs == [b]  # not a decode of a
    run_step(sched, [b])
    step = sched.schedule()
    assert step is not None and step.phase is Phase.DECODE and step.seqs == [a, b]


def test_schedule_returns_none_when_idle() -> None:
    sched = make_scheduler()
    assert sched.schedule() is None
    a = seq(3)
    sched.add(a)
    sched.schedule()
    sched.finish(a)
    assert sched.schedule() is None


def test_decode_takes_one_more_block_when_crossing_a_boundary() -> None:
    sched = make_scheduler(num_blocks=10)
    a = seq(3)
    sched.add(a)
    sched.schedule()
    assert len(a.block_table) == 1
    run_step(sched, [a])  # 4 tokens: block 1 exactly full
    step = sched.schedule()
    assert step is not None and step.phase is Phase.DECODE
    assert len(a.block_table) == 1
    run_step(sched, [a])  # 5 tokens: needs a second block
    first = list(a.block_table)
    step = sched.schedule()
    assert step is not None and step.seqs == [a]
    assert len(a.block_table) == 2
    assert a.block_table[:1] == first  # existing blocks kept, one appended
    assert sched.allocator.num_used == 2
    for expected in (2, 2, 2, 3):  # 6, 7, 8 tokens fit in 2 blocks; 9 needs 3
        run_step(sched, [a])
        sched.schedule()
        assert len(a.block_table) == expected


def test_decode_preempts_most_recently_admitted_when_out_of_blocks() -> None:
    sched = make_scheduler(num_blocks=2)
    a, b = seq(4, "a"), seq(4, "b")
    sched.add(a)
    sched.add(b)
    step = sched.schedule()
    assert step is not None and step.seqs == [a, b]
    assert sched.allocator.num_free == 0
    run_step(sched, [a, b])  # both now at 5 tokens: each needs a second block, none is free
    b_blocks = list(b.block_table)
    step = sched.schedule()
    assert step is not None and step.phase is Phase.DECODE
    assert step.seqs == [a]
    assert sched.running == [a]
    assert a.block_table[1] == b_blocks[0]  # a got the block b gave up
    assert b.status is SequenceStatus.WAITING
    assert b.block_table == [] and b.num_cached_tokens == 0
    assert list(sched.waiting) == [b]
    assert b.output_token_ids == [7]  # kept: it is recomputed from prompt + output
    assert sched.num_preemptions == 1
    assert sched.allocator.num_used == 2


def test_preempted_sequence_goes_to_front_of_waiting_and_is_recomputed() -> None:
    sched = make_scheduler(num_blocks=2)
    a, b, late = seq(4, "a"), seq(4, "b"), seq(1, "late")
    sched.add(a)
    sched.add(b)
    sched.schedule()
    sched.add(late)  # cannot be prefilled: no block free
    run_step(sched, [a, b])
    step = sched.schedule()
    assert step is not None and step.phase is Phase.DECODE and step.seqs == [a]
    assert list(sched.waiting) == [b, late]
    sched.finish(a)
    step = sched.schedule()
    assert step is not None and step.phase is Phase.PREFILL
    assert step.seqs == [b]  # recomputed first: 5 tokens -> both blocks, nothing left for late
    assert len(b.block_table) == 2 and b.num_cached_tokens == 0
    assert list(sched.waiting) == [late]


def test_latest_sequence_is_preempted_even_if_it_needs_no_block() -> None:
    sched = make_scheduler(num_blocks=3)
    a, b = seq(8, "a"), seq(3, "b")  # a: 2 blocks, b: 1 block; pool full
    sched.add(a)
    sched.add(b)
    sched.schedule()
    run_step(sched, [a, b])  # a: 9 tokens needs a 3rd block; b: 4 tokens still fits
    step = sched.schedule()
    assert step is not None and step.phase is Phase.DECODE and step.seqs == [a]
    assert len(a.block_table) == 3
    assert b.status is SequenceStatus.WAITING and list(sched.waiting) == [b]
    assert sched.num_preemptions == 1


def test_latest_sequence_preempts_itself_and_earlier_ones_keep_decoding() -> None:
    sched = make_scheduler(num_blocks=3)
    a, b = seq(3, "a"), seq(8, "b")  # a: 1 block, b: 2 blocks; pool full
    sched.add(a)
    sched.add(b)
    sched.schedule()
    run_step(sched, [a, b])  # a: 4 tokens fits; b: 9 tokens needs a 3rd block
    a_blocks = list(a.block_table)
    step = sched.schedule()
    assert step is not None and step.phase is Phase.DECODE and step.seqs == [a]
    assert a.block_table == a_blocks
    assert b.status is SequenceStatus.WAITING and b.block_table == []
    assert list(sched.waiting) == [b]
    assert sched.allocator.num_free == 2
    assert sched.num_preemptions == 1


def test_preemption_victim_later_in_the_batch_is_not_decoded() -> None:
    sched = make_scheduler(num_blocks=3)
    a, b, c = seq(8, "a"), seq(4, "b"), seq(1, "c")
    sched.add(a)
    sched.add(b)
    sched.schedule()  # a: 2 blocks, b: 1 block
    sched.finish(a)
    sched.add(c)
    sched.schedule()  # c: 1 block
    run_step(sched, [b, c])  # b: 5 tokens needs a 2nd block; c: 2 tokens fits
    sched.add(seq(4, "d"))
    assert sched.schedule().seqs[0].request_id == "d"  # d takes the last free block
    run_step(sched, [sched.running[-1]])  # d: 5 tokens, needs a 2nd block too
    assert [s.request_id for s in sched.running] == ["b", "c", "d"]
    assert sched.allocator.num_free == 0
    # b needs a block: d (latest) is preempted, b takes d's block; c fits; d is gone from the batch
    step = sched.schedule()
    assert step is not None and [s.request_id for s in step.seqs] == ["b", "c"]
    assert [s.request_id for s in sched.waiting] == ["d"]
    assert sched.num_preemptions == 1


def test_lone_sequence_that_outgrows_the_pool_preempts_itself() -> None:
    sched = make_scheduler(num_blocks=1)
    a = seq(4)
    sched.add(a)
    sched.schedule()
    run_step(sched, [a])  # 5 tokens need 2 blocks; the pool has 1
    assert sched.schedule() is None
    assert a.status is SequenceStatus.WAITING and a.block_table == []
    assert sched.allocator.num_free == 1
    assert sched.num_preemptions == 1


@pytest.mark.parametrize("where", ["running", "waiting", "parked"])
def test_finish_frees_blocks_wherever_the_sequence_is(where: str) -> None:
    sched = make_scheduler(num_blocks=8)
    keep, target = seq(4, "keep"), seq(6, "target")
    sched.add(keep)
    sched.add(target)
    if where == "waiting":
        sched.finish(target)  # before it was ever scheduled
        assert list(sched.waiting) == [keep]
    else:
        sched.schedule()
        if where == "parked":
            sched.park(target)
        assert sched.allocator.num_used == 3
        sched.finish(target)
        assert sched.running == [keep]
    assert target.status is SequenceStatus.FINISHED
    assert target.block_table == []
    assert "target" not in sched.parked
    assert target not in sched.running and target not in sched.waiting
    assert sched.allocator.num_used == len(keep.block_table)


def test_finish_of_a_preempted_sequence_frees_nothing_twice() -> None:
    sched = make_scheduler(num_blocks=2)
    a, b = seq(4), seq(4)
    sched.add(a)
    sched.add(b)
    sched.schedule()
    run_step(sched, [a, b])
    sched.schedule()  # b preempted, its block freed
    sched.finish(b)  # must not free b's old block a second time
    assert b.status is SequenceStatus.FINISHED
    assert not sched.waiting
    assert sched.allocator.num_used == 2  # both belong to a


def test_park_keeps_blocks_and_stops_scheduling() -> None:
    sched = make_scheduler(num_blocks=8)
    a, b = seq(6, "a"), seq(3, "b")
    sched.add(a)
    sched.add(b)
    sched.schedule()
    run_step(sched, [a, b])
    blocks = list(a.block_table)
    sched.park(a)
    assert a.status is SequenceStatus.PARKED
    assert sched.parked == {"a": a}
    assert a.block_table == blocks
    assert sched.allocator.num_used == 3
    step = sched.schedule()
    assert step is not None and step.phase is Phase.DECODE and step.seqs == [b]
    sched.finish(a)
    assert sched.parked == {}
    assert sched.allocator.num_used == 1


def test_admit_prefilled_allocates_all_tokens_and_caches_all_but_the_last() -> None:
    sched = make_scheduler(num_blocks=8)
    s = Sequence([1, 2, 3, 4, 5, 6, 7, 8], SamplingParams(), output_token_ids=[9])  # 9 tokens
    sched.admit_prefilled(s)
    assert len(s.block_table) == 3
    assert s.num_cached_tokens == 8
    assert s.status is SequenceStatus.RUNNING
    assert sched.running == [s]
    step = sched.schedule()
    assert step is not None and step.phase is Phase.DECODE and step.seqs == [s]
    assert len(s.block_table) == 3  # no extra block: the last token's slot is already allocated


def test_admit_prefilled_refuses_a_full_batch() -> None:
    sched = make_scheduler(num_blocks=8, max_num_seqs=1)
    sched.admit_prefilled(seq(2))
    extra = seq(2)
    with pytest.raises(OutOfBlocks, match="full"):
        sched.admit_prefilled(extra)
    assert extra.block_table == [] and extra.status is SequenceStatus.WAITING
    assert sched.allocator.num_used == 1


def test_admit_prefilled_raises_when_blocks_run_out() -> None:
    sched = make_scheduler(num_blocks=2)
    big = seq(9)  # 3 blocks
    with pytest.raises(OutOfBlocks):
        sched.admit_prefilled(big)
    assert sched.running == [] and sched.allocator.num_free == 2


def test_allocator_rejects_double_free_and_over_allocation() -> None:
    alloc = BlockAllocator(2)
    blocks = alloc.allocate(2)
    assert sorted(blocks) == [0, 1]
    with pytest.raises(OutOfBlocks):
        alloc.allocate(1)
    alloc.free(blocks)
    with pytest.raises(ValueError, match="freed twice"):
        alloc.free([blocks[0]])
    assert alloc.num_free == 2 and alloc.num_used == 0


def test_a_sequence_moved_here_decodes_first_alone_then_with_the_batch() -> None:
    sched = make_scheduler(num_blocks=16)
    running = seq(4, "running")
    sched.add(running)
    first = sched.schedule()
    assert first is not None and first.phase is Phase.PREFILL
    run_step(sched, [running])
    waiting = seq(4, "waiting")
    sched.add(waiting)  # a prompt is queued too: the arrival still goes first
    moved = Sequence([1, 2, 3, 4, 5], SamplingParams(), request_id="moved", output_token_ids=[6])
    sched.admit_moved(moved, sched.allocator.allocate(2))
    arrival = sched.schedule()
    assert arrival is not None and arrival.phase is Phase.DECODE and arrival.seqs == [moved]
    run_step(sched, [moved])
    prefill = sched.schedule()
    assert prefill is not None and prefill.phase is Phase.PREFILL and prefill.seqs == [waiting]
    run_step(sched, [waiting])
    decode = sched.schedule()
    assert decode is not None and decode.seqs == [running, moved, waiting]


def test_a_moved_sequence_that_ended_before_its_step_is_not_scheduled() -> None:
    sched = make_scheduler(num_blocks=16)
    moved = Sequence([1, 2, 3], SamplingParams(), request_id="moved", output_token_ids=[4])
    sched.admit_moved(moved, sched.allocator.allocate(1))
    sched.finish(moved)
    assert sched.schedule() is None


def test_a_draft_takes_free_blocks_only_and_is_cut_to_what_fits() -> None:
    sched = make_scheduler(num_blocks=3)
    s = Sequence([1, 2, 3], SamplingParams(), output_token_ids=[4])  # 4 tokens: one full block
    sched.admit_prefilled(s)
    s.draft_token_ids = [5, 6, 7, 8, 9, 10, 11, 12, 13]  # 13 tokens would need 4 blocks; 3 are all there is
    step = sched.schedule()
    assert step is not None and step.chunks == [1 + 8] and s.draft_token_ids == [5, 6, 7, 8, 9, 10, 11, 12]
    assert len(s.block_table) == 3 and sched.allocator.num_free == 0
    s.output_token_ids += [5, 6]  # two drafted tokens stood, then the model's own: 7 tokens
    s.num_cached_tokens = 6
    sched.trim(s)
    assert len(s.block_table) == 2 and sched.allocator.num_free == 1


def test_a_windowed_scheduler_drops_drafts() -> None:
    sched = Scheduler(SchedulerConfig(block_size=BLOCK, kv_window=KVWindow(8, BLOCK, 1, apart=False)),
                      BlockManager(16, BLOCK))
    s = Sequence([1, 2, 3], SamplingParams(), output_token_ids=[4])
    sched.admit_prefilled(s)
    s.draft_token_ids = [5, 6]
    step = sched.schedule()
    assert step is not None and step.chunks == [1] and s.draft_token_ids == []


def test_drafts_take_blocks_only_after_every_sequence_has_its_own_slot() -> None:
    sched = make_scheduler(num_blocks=4)
    first, second = (Sequence([1, 2, 3], SamplingParams(), request_id=r, output_token_ids=[4]) for r in "ab")
    sched.admit_prefilled(first)
    sched.admit_prefilled(second)
    sched.schedule()
    run_step(sched, [first, second])  # 5 tokens each: their next steps need a block each, and two are free
    first.draft_token_ids = [5, 6, 7, 8]
    step = sched.schedule()
    assert step is not None and step.seqs == [first, second] and not sched.waiting  # nothing preempted
    assert step.chunks == [4, 1] and first.draft_token_ids == [5, 6, 7]  # the slots left in its own last block
    assert sched.allocator.num_free == 0
