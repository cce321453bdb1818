"""Per-step records folded into per-worker per-second rows (store/aggregate.py's conventions)."""

import pytest

from fleetctl.domain import Phase, WorkerRole
from fleetctl.store.aggregate import AggregatorConfig, StepAggregator, StepRecord

PEAK_FLOPS, PEAK_BYTES = 1e12, 1e10


def step(ts: float, busy_s: float, *, phase: Phase = Phase.DECODE, tokens: int = 8, flops: float = 1e9,
         nbytes: float = 1e8, batch: int = 8, kv: float = 0.25, queue: int = 0, wid: str = "decode-0") -> StepRecord:
    return StepRecord(wid, ts, busy_s, phase, tokens, flops, nbytes, batch, kv, queue)


def aggregator(since: float = 100.0, role: WorkerRole = WorkerRole.DECODE) -> StepAggregator:
    agg = StepAggregator(AggregatorConfig(bucket_s=1.0, grace_s=0.5))
    agg.add_worker("decode-0", role, PEAK_FLOPS, PEAK_BYTES, since=since)
    return agg


def test_busy_mfu_and_mbu_are_over_the_seconds_wall_time():
    agg = aggregator()
    for end in (100.2, 100.5, 100.9):
        agg.add_step(step(end, 0.1))
    [row] = agg.collect(now=101.6)
    assert row.ts == 100.0 and row.interval_s == 1.0
    assert row.busy == pytest.approx(0.3)
    assert row.steps == 3 and row.decode_tokens == 24 and row.prefill_tokens == 0
    assert row.flops == 3 * 10**9 and row.bytes == 3 * 10**8
    assert row.mfu == pytest.approx(3e9 / PEAK_FLOPS)  # per wall second, not per busy second
    assert row.mbu == pytest.approx(3e8 / PEAK_BYTES)
    assert row.batch_size == 8.0


def test_nothing_is_emitted_inside_the_grace_period():
    agg = aggregator()
    agg.add_step(step(100.5, 0.1))
    assert agg.collect(now=101.2) == []  # second 100 closed 0.2 s ago: still open (grace 0.5 + longest step 0.1)
    assert len(agg.collect(now=101.6)) == 1


def test_seconds_stay_open_as_long_as_the_longest_step():
    """A 3 s prefill reports once, when it ends: its seconds must still be open then."""
    agg = aggregator()
    agg.add_step(step(100.5, 0.1))
    agg.add_step(step(104.0, 3.0, phase=Phase.PREFILL, flops=3e9))
    assert agg.collect(now=104.2) == []  # every second waits 3.5 s now: a step as long as 3 s may still come
    rows = agg.collect(now=108)
    assert [r.ts for r in rows] == [100.0, 101.0, 102.0, 103.0]
    assert [r.busy for r in rows] == pytest.approx([0.1, 1.0, 1.0, 1.0])
    assert sum(r.flops for r in rows) == 4 * 10**9


def test_a_step_across_a_boundary_is_split_by_time_and_adds_up_exactly():
    agg = aggregator()
    agg.add_step(step(101.6, 1.2, phase=Phase.PREFILL, tokens=512, flops=1_000_000_001, nbytes=333))
    rows = agg.collect(now=104)
    first, second = rows
    assert first.busy == pytest.approx(0.6) and second.busy == pytest.approx(0.6)
    assert first.flops + second.flops == 1_000_000_001
    assert first.bytes + second.bytes == 333
    assert first.flops == pytest.approx(1e9 / 2, rel=1e-6)
    # the step's count and tokens go to the second in which it ended
    assert (first.steps, first.prefill_tokens, second.steps, second.prefill_tokens) == (0, 0, 1, 512)


def test_idle_seconds_get_rows_and_gauges_carry_forward():
    agg = aggregator()
    agg.add_step(step(100.5, 0.1, kv=0.4, queue=3))
    agg.add_step(step(100.7, 0.1, kv=0.5, queue=2))
    rows = agg.collect(now=104)
    assert [r.ts for r in rows] == [100.0, 101.0, 102.0]
    assert [r.busy for r in rows[1:]] == [0.0, 0.0]
    assert [(r.kv_usage, r.queue) for r in rows] == [(0.5, 2.0)] * 3  # the last step's, carried
    assert rows[1].batch_size == 0.0 and rows[1].mfu == 0.0


def test_a_late_step_is_credited_to_the_oldest_open_second():
    agg = aggregator()
    agg.add_step(step(100.5, 0.1))
    assert len(agg.collect(now=101.6)) == 1
    agg.add_step(step(100.9, 0.2, tokens=5))  # second 100 was already written
    [row] = agg.collect(now=102.8)
    assert row.ts == 101.0 and row.decode_tokens == 5 and row.flops == 10**9
    assert row.busy == pytest.approx(0.2)


def test_first_and_last_seconds_cover_only_the_workers_lifetime():
    agg = aggregator(since=100.5)
    agg.add_step(step(100.75, 0.25))
    agg.add_step(step(101.2, 0.1))
    agg.stop_worker("decode-0", at=101.25)
    first, last = agg.collect(now=101.3)  # a stopped worker's last second does not wait
    assert (first.ts, first.interval_s, first.busy) == (100.5, 0.5, 0.5)
    assert (last.ts, last.interval_s) == (101.0, 0.25)
    assert last.busy == pytest.approx(0.4)
    assert last.mfu == pytest.approx(1e9 / 0.25 / PEAK_FLOPS)
    agg.add_step(step(101.5, 0.1))  # the worker is gone
    assert agg.dropped_steps == 1
    assert agg.collect(now=110) == []


def test_late_time_carries_forward_and_no_second_passes_one():
    agg = aggregator()
    agg.add_step(step(100.9, 0.9))
    assert len(agg.collect(now=102.5)) == 1
    agg.add_step(step(100.95, 0.05))  # late: second 100 is written, its 0.05 s go to second 101 ...
    agg.add_step(step(101.99, 0.99))  # ... which then fills up: the overflow moves on to second 102
    rows = agg.collect(now=105)
    assert [r.busy for r in rows] == pytest.approx([1.0, 0.04])
    assert sum(r.flops for r in rows) == 2 * 10**9 and rows[0].steps == 2


def test_steps_from_unknown_workers_or_with_bad_times_are_dropped_and_config_is_checked():
    agg = aggregator()
    agg.add_step(step(100.5, 0.1, wid="ghost-0"))
    agg.add_step(step(100.5, float("nan")))
    agg.add_step(step(float("inf"), 0.1))
    agg.add_step(step(100.5, -0.1))
    assert agg.dropped_steps == 4
    assert agg.collect(now=102)[0].steps == 0
    with pytest.raises(ValueError):
        agg.add_worker("decode-1", WorkerRole.DECODE, 0.0, PEAK_BYTES, since=0.0)
    with pytest.raises(ValueError):
        AggregatorConfig(bucket_s=0.0)
