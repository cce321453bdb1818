"""Router: pure routing decisions over WorkerView snapshots."""

import pytest

from fleetctl.domain import WorkerRole, WorkerState
from fleetctl.engine.core.block_allocator import BLOCK_SIZE
from fleetctl.engine.fleet.router import Router, RouterConfig
from fleetctl.engine.fleet.worker_kv import WorkerKV
from fleetctl.engine.fleet.worker_view import WorkerView


def view(
    worker_id: str,
    role: WorkerRole = WorkerRole.PREFILL,
    *,
    state: WorkerState = WorkerState.RUNNING,
    requests: int = 0,
    free_blocks: int = 0,
    num_kv_blocks: int = 100,
    block_size: int = BLOCK_SIZE,
) -> WorkerView:
    return WorkerView(
        worker_id,
        role,
        "cpu:0",
        state=state,
        requests={f"{worker_id}-r{i}" for i in range(requests)},
        kv=WorkerKV(num_kv_blocks, block_size, free=free_blocks),
    )


def test_default_view_is_starting_and_not_accepting() -> None:
    v = WorkerView("w", WorkerRole.DECODE, "cpu:0")
    assert v.state is WorkerState.STARTING
    assert not v.accepting
    assert v.kv.block_size == BLOCK_SIZE


@pytest.mark.parametrize("state", list(WorkerState))
def test_only_running_workers_accept(state: WorkerState) -> None:
    assert view("w", state=state).accepting is (state is WorkerState.RUNNING)


def test_prefill_pick_takes_fewest_requests() -> None:
    views = [view("a", requests=3), view("b", requests=1), view("c", requests=2)]
    assert Router().pick_prefill_worker(views).worker_id == "b"


def test_prefill_pick_breaks_ties_by_worker_id() -> None:
    views = [view("w2", requests=1), view("w10", requests=1), view("w1", requests=1), view("w0", requests=2)]
    assert Router().pick_prefill_worker(views).worker_id == "w1"
    assert Router().pick_prefill_worker(list(reversed(views))).worker_id == "w1"


def test_prompts_go_to_prefill_and_mixed_workers_handoffs_to_decode_and_mixed_ones() -> None:
    views = [view("d", WorkerRole.DECODE, free_blocks=10), view("m", WorkerRole.MIXED, requests=5, free_blocks=10),
             view("p", requests=9, free_blocks=10)]
    router = Router()
    assert router.pick_prefill_worker(views).worker_id == "m"  # fewer requests than p; d takes no prompt
    assert router.pick_prefill_worker(views[:1]) is None
    assert router.pick_decode_worker(views, 1).worker_id == "d"
    assert router.pick_decode_worker(views[1:], 1).worker_id == "m"  # p decodes nothing


@pytest.mark.parametrize("state", [s for s in WorkerState if s is not WorkerState.RUNNING])
def test_prefill_pick_skips_workers_that_are_not_running(state: WorkerState) -> None:
    views = [view("idle", state=state), view("busy", requests=50)]
    assert Router().pick_prefill_worker(views).worker_id == "busy"
    assert Router().pick_prefill_worker([view("idle", state=state)]) is None


def test_prefill_pick_skips_full_workers() -> None:
    router = Router(RouterConfig(max_requests_per_worker=2))
    assert (
        router.pick_prefill_worker([view("a", requests=2), view("b", requests=1)]).worker_id == "b"
    )
    assert router.pick_prefill_worker([view("a", requests=2), view("b", requests=3)]) is None


def test_default_request_limit() -> None:
    router = Router()
    limit = RouterConfig().max_requests_per_worker
    assert router.pick_prefill_worker([view("a", requests=limit - 1)]) is not None
    assert router.pick_prefill_worker([view("a", requests=limit)]) is None


def test_prefill_pick_with_no_workers() -> None:
    assert Router().pick_prefill_worker([]) is None


def decode(worker_id: str, **kw: object) -> WorkerView:
    return view(worker_id, WorkerRole.DECODE, **kw)


def test_decode_pick_needs_free_blocks_for_the_tokens() -> None:
    router = Router()
    # 33 tokens need 3 blocks of 16
    assert router.pick_decode_worker([decode("a", free_blocks=2)], 33) is None
    assert router.pick_decode_worker([decode("a", free_blocks=3)], 33).worker_id == "a"
    assert router.pick_decode_worker([decode("a", free_blocks=2)], 32).worker_id == "a"


def test_decode_pick_uses_each_views_own_block_size() -> None:
    router = Router()
    small = decode("small", free_blocks=10, block_size=4)  # 10 * 4 = 40 tokens
    large = decode("large", free_blocks=3, block_size=32, requests=5)  # 3 * 32 = 96 tokens
    assert router.pick_decode_worker([small, large], 40).worker_id == "small"
    assert router.pick_decode_worker([small, large], 41).worker_id == "large"
    assert router.pick_decode_worker([small, large], 97) is None


def test_decode_pick_prefers_fewer_requests_then_more_free_blocks() -> None:
    router = Router()
    views = [
        decode("a", requests=2, free_blocks=90),
        decode("b", requests=1, free_blocks=5),
        decode("c", requests=1, free_blocks=20),
    ]
    assert router.pick_decode_worker(views, 16).worker_id == "c"
    views.append(decode("d", requests=0, free_blocks=1))
    assert router.pick_decode_worker(views, 16).worker_id == "d"
    assert router.pick_decode_worker(views, 17).worker_id == "c"  # d lacks the 2nd block


def test_decode_pick_ties_by_worker_id() -> None:
    views = [decode("y", requests=1, free_blocks=8), decode("x", requests=1, free_blocks=8)]
    assert Router().pick_decode_worker(views, 1).worker_id == "x"


def test_decode_pick_only_takes_running_workers_that_decode() -> None:
    router = Router()
    views = [
        view("p", WorkerRole.PREFILL, free_blocks=100),
        view("m", WorkerRole.MIXED, state=WorkerState.DRAINING, free_blocks=100),
        decode("draining", state=WorkerState.DRAINING, free_blocks=100),
        decode("starting", state=WorkerState.STARTING, free_blocks=100),
    ]
    assert router.pick_decode_worker(views, 1) is None
    views.append(decode("ok", free_blocks=1, requests=500))  # no request cap on handoffs
    assert router.pick_decode_worker(views, 1).worker_id == "ok"


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (WorkerState.RUNNING, True),
        (WorkerState.STARTING, True),
        (WorkerState.DRAINING, False),
        (WorkerState.CHECKPOINTED, False),
        (WorkerState.STOPPED, False),
        (WorkerState.FAILED, False),
    ],
)
def test_covered_counts_running_and_starting(state: WorkerState, expected: bool) -> None:
    views = [view("p", WorkerRole.PREFILL), view("d", WorkerRole.DECODE, state=state)]
    assert Router.covered(views, WorkerRole.DECODE) is expected
    assert Router.covered(views, WorkerRole.PREFILL) is True


def test_a_mixed_worker_covers_both_phases() -> None:
    assert Router.covered([view("m", WorkerRole.MIXED)], WorkerRole.PREFILL) is True
    assert Router.covered([view("m", WorkerRole.MIXED)], WorkerRole.DECODE) is True
    assert Router.covered([view("p", WorkerRole.PREFILL)], WorkerRole.DECODE) is False


def test_covered_with_no_workers() -> None:
    assert Router.covered([], WorkerRole.PREFILL) is False


def test_kv_usage() -> None:
    assert view("w", free_blocks=25, num_kv_blocks=100).kv.usage == pytest.approx(0.75)
    assert view("w", free_blocks=100, num_kv_blocks=100).kv.usage == 0.0
    assert view("w", free_blocks=0, num_kv_blocks=8).kv.usage == 1.0
    assert view("w", free_blocks=0, num_kv_blocks=0).kv.usage == 0.0  # not reported yet
