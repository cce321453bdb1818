"""The discrete-event replay on cost models simple enough to work out by hand: constant step times, so every
timing below is a sum of steps."""

import pytest

from fleetctl.domain import DeviceKind
from fleetctl.engine.planner.costs import DeviceCosts
from fleetctl.engine.planner.fit import LinearFit
from fleetctl.engine.planner.simulator import EngineLimits, SimRequest, simulate
from fleetctl.engine.planner.split import Split

PREFILL_S, DECODE_S, HANDOFF_S = 1.0, 0.1, 0.05


def costs(prefill_per_token: float = 0.0, decode_per_seq: float = 0.0, handoff: bool = True) -> DeviceCosts:
    return DeviceCosts(
        DeviceKind.CPU,
        LinearFit(("1", "tokens", "tokens²"), (PREFILL_S, prefill_per_token, 0.0), 3, 0.0),
        LinearFit(("1", "batch", "context"), (DECODE_S, decode_per_seq, 0.0), 3, 0.0),
        LinearFit(("1", "bytes"), (HANDOFF_S, 0.0), 3, 0.0) if handoff else None,
        bytes_per_token=1000.0, peaks=None)


def test_one_request_through_a_split() -> None:
    [t] = simulate([SimRequest(0.0, 100, 11)], Split(1, 1), costs())
    assert t.ttft_s == pytest.approx(PREFILL_S)
    # ten decode steps after the handoff: TPOT carries the handoff too
    assert t.e2e_s == pytest.approx(PREFILL_S + HANDOFF_S + 10 * DECODE_S)
    assert t.tpot_s == pytest.approx((HANDOFF_S + 10 * DECODE_S) / 10)


def test_a_one_token_answer_ends_at_its_prefill() -> None:
    [t] = simulate([SimRequest(0.0, 100, 1)], Split(1, 1), costs())
    assert (t.ttft_s, t.tpot_s, t.e2e_s) == (pytest.approx(PREFILL_S), None, pytest.approx(PREFILL_S))


def test_prompts_queue_on_the_least_loaded_prefill_worker() -> None:
    requests = [SimRequest(0.0, 5000, 2), SimRequest(0.0, 5000, 2), SimRequest(0.0, 5000, 2)]  # over the budget
    one = simulate(requests, Split(1, 1), costs())
    assert [t.ttft_s for t in one] == pytest.approx([1.0, 2.0, 3.0])
    two = simulate(requests, Split(2, 1), costs())
    assert [t.ttft_s for t in two] == pytest.approx([1.0, 1.0, 2.0])


def test_prompts_that_fit_the_token_budget_share_a_step() -> None:
    requests = [SimRequest(0.0, 1000, 2), SimRequest(0.0, 1000, 2)]
    timings = simulate(requests, Split(1, 1), costs(prefill_per_token=1e-4))
    assert [t.ttft_s for t in timings] == pytest.approx([PREFILL_S + 0.2] * 2)


def test_decode_batches_continuously_and_the_batch_size_caps_it() -> None:
    requests = [SimRequest(0.0, 10, 5) for _ in range(3)]
    batched = simulate(requests, Split(mixed=1), costs(decode_per_seq=0.01), EngineLimits(max_num_seqs=64))
    # one prefill step for all three, then four decode steps of three sequences
    assert [t.e2e_s for t in batched] == pytest.approx([PREFILL_S + 4 * (DECODE_S + 0.03)] * 3)
    capped = simulate(requests, Split(2, 1), costs(), EngineLimits(max_num_seqs=2))
    # all three handed over at 1.05 s; the decode worker takes two, the third waits for a slot, then decodes alone
    ends = sorted(t.e2e_s for t in capped)
    assert ends == pytest.approx([1.45, 1.45, 1.45 + 4 * DECODE_S])


def test_a_mixed_worker_stalls_its_decodes_for_a_prefill() -> None:
    requests = [SimRequest(0.0, 10, 6), SimRequest(1.15, 10, 2)]
    first, second = simulate(requests, Split(mixed=1), costs(handoff=False))
    # the second prompt arrives during the first's second decode step; its prefill runs from 1.2 s to 2.2 s
    assert second.ttft_s == pytest.approx(1.2 + PREFILL_S - 1.15)
    assert first.e2e_s == pytest.approx(PREFILL_S + 2 * DECODE_S + PREFILL_S + 3 * DECODE_S)
    split_first, _ = simulate(requests, Split(1, 1), costs(handoff=False))
    assert split_first.e2e_s == pytest.approx(PREFILL_S + 5 * DECODE_S)  # no stall on its own decode worker


def test_a_local_prefill_runs_on_a_decode_worker_with_no_handoff() -> None:
    """Conditional disaggregation as measured: the request's decode worker prefills it (its computed tokens)
    and keeps it; the prefill worker stays free for the next prompt."""
    local, remote = SimRequest(0.0, 1000, 11, cached_tokens=900, local=True), SimRequest(0.0, 1000, 11)
    [t] = simulate([local], Split(1, 1), costs(prefill_per_token=1e-3))
    assert t.ttft_s == pytest.approx(PREFILL_S + 0.1)  # 100 computed tokens
    assert t.e2e_s == pytest.approx(PREFILL_S + 0.1 + 10 * DECODE_S)  # no handoff
    both = simulate([local, remote], Split(1, 1), costs())
    assert [t.ttft_s for t in both] == pytest.approx([PREFILL_S, PREFILL_S])  # side by side, not queued
    [mixed] = simulate([local], Split(mixed=1), costs(prefill_per_token=1e-3))
    assert mixed.ttft_s == pytest.approx(PREFILL_S + 0.1)  # colocated: a mixed worker prefills it anyway
    with pytest.raises(ValueError, match="cached tokens"):
        SimRequest(0.0, 10, 1, cached_tokens=10)
