"""KV-aware routing without processes: the digest changes a worker sends and the controller's copy of them,
and the router weighing cached overlap against load, with real hash chains."""

from fleetctl.domain import WorkerRole, WorkerState
from fleetctl.engine.core.block_hash import PrefixDigest, chain_hashes
from fleetctl.engine.fleet.router import Router, RouterConfig
from fleetctl.engine.fleet.worker_kv import WorkerKV
from fleetctl.engine.fleet.worker_view import WorkerView
from fleetctl.engine.worker.prefix_summary import SUMMARY_INTERVAL_S, PrefixIndex, PrefixSummary

ROOT = b"r" * 16
TURN1 = [(7 * i + 5) % 300 + 3 for i in range(320)]  # 20 blocks
TURN2 = TURN1 + [(11 * i + 1) % 300 + 3 for i in range(100)]


def digest(tokens: list[int]) -> PrefixDigest:
    return PrefixDigest(ROOT, 16, frozenset(chain_hashes(ROOT, tokens, 16)))


def worker(worker_id: str, role: WorkerRole, holds: list[int] | None = None, sessions: int = 0,
           backlog: int = 0) -> WorkerView:
    view = WorkerView(worker_id, role, "cpu:0", state=WorkerState.RUNNING, kv=WorkerKV(100),
                      requests={f"{worker_id}-{i}" for i in range(sessions)})
    if backlog:
        view.prefilling[f"{worker_id}-0"] = backlog
    if holds is not None:
        changes = PrefixSummary().changes(lambda: digest(holds), 0.0, urgent=True)
        assert changes is not None
        view.prefix.apply(changes)
    return view


def cached(tokens: list[int]):
    return lambda view: view.prefix.cached_blocks(chain_hashes(ROOT, tokens, 16)) * 16


def test_changes_start_with_a_reset_then_carry_only_differences() -> None:
    summary, index = PrefixSummary(), PrefixIndex()
    first = summary.changes(lambda: digest(TURN1[:64]), 0.0, urgent=False)
    assert first is not None and first.reset and len(first.added) == 4 and not first.removed
    index.apply(first)
    assert summary.changes(lambda: digest(TURN1[:64]), 0.01, urgent=True) is None  # nothing changed
    assert summary.changes(lambda: digest(TURN1[:96]), SUMMARY_INTERVAL_S / 2, urgent=False) is None  # not due
    grown = summary.changes(lambda: digest(TURN1[:96]), SUMMARY_INTERVAL_S / 2, urgent=True)
    assert grown is not None and not grown.reset and len(grown.added) == 2
    index.apply(grown)
    evicted = summary.changes(lambda: digest(TURN1[:32]), 5.0, urgent=False)
    assert evicted is not None and len(evicted.removed) == 4 and not evicted.added
    index.apply(evicted)
    assert index.hashes == set(chain_hashes(ROOT, TURN1[:32], 16))
    assert index.cached_blocks(chain_hashes(ROOT, TURN1, 16)) == 2
    index.clear()
    assert index.cached_blocks(chain_hashes(ROOT, TURN1, 16)) == 0


def test_turn_two_goes_to_the_prefill_worker_holding_turn_one() -> None:
    router = Router()
    views = [worker("prefill-0", WorkerRole.PREFILL), worker("prefill-1", WorkerRole.PREFILL, holds=TURN1),
             worker("prefill-2", WorkerRole.PREFILL)]
    pick = router.pick_prefill_worker(views, num_tokens=len(TURN2), cached=cached(TURN2))
    assert pick.worker_id == "prefill-1"
    # busier, but its backlog (300 tokens) is less than what its cache saves (320): still the fastest
    views[1] = worker("prefill-1", WorkerRole.PREFILL, holds=TURN1, sessions=1, backlog=300)
    assert router.pick_prefill_worker(views, num_tokens=len(TURN2),
                                      cached=cached(TURN2)).worker_id == "prefill-1"


def test_a_hot_prefill_worker_with_the_prefix_loses_to_an_idle_one_without_it() -> None:
    views = [worker("prefill-0", WorkerRole.PREFILL, holds=TURN1, sessions=3, backlog=1500),
             worker("prefill-1", WorkerRole.PREFILL, sessions=1, backlog=50)]
    pick = Router().pick_prefill_worker(views, num_tokens=len(TURN2), cached=cached(TURN2))
    assert pick.worker_id == "prefill-1"


def test_without_cache_information_prefill_picks_the_smallest_backlog_then_fewest_requests() -> None:
    views = [worker("a", WorkerRole.PREFILL, sessions=1, backlog=900), worker("b", WorkerRole.PREFILL, sessions=2),
             worker("c", WorkerRole.PREFILL, sessions=1)]
    assert Router().pick_prefill_worker(views, num_tokens=100).worker_id == "c"


def test_backlog_forgets_requests_the_worker_no_longer_holds() -> None:
    view = worker("p", WorkerRole.PREFILL, sessions=1)
    view.prefilling = {"p-0": 100, "gone": 5000}
    assert view.prefill_backlog() == 100 and view.prefilling == {"p-0": 100}


def test_turn_two_goes_to_the_decode_worker_holding_turn_one_unless_it_is_overloaded() -> None:
    slack = RouterConfig().decode_load_slack
    views = [worker("decode-0", WorkerRole.DECODE, sessions=1),
             worker("decode-1", WorkerRole.DECODE, holds=TURN1, sessions=1 + slack)]
    assert Router().pick_decode_worker(views, len(TURN2), cached=cached(TURN2)).worker_id == "decode-1"
    views[1] = worker("decode-1", WorkerRole.DECODE, holds=TURN1, sessions=2 + slack)
    assert Router().pick_decode_worker(views, len(TURN2), cached=cached(TURN2)).worker_id == "decode-0"


def test_decode_workers_tie_on_overlap_by_load() -> None:
    views = [worker("decode-0", WorkerRole.DECODE, holds=TURN1, sessions=3),
             worker("decode-1", WorkerRole.DECODE, holds=TURN1, sessions=2)]
    assert Router().pick_decode_worker(views, len(TURN2), cached=cached(TURN2)).worker_id == "decode-1"
