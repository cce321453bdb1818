"""Routing with the node's KV tiers: the blocks a tier holds after a worker's pool count as cached at a
discount — a prompt whose prefix a tier holds goes to an idle worker that reads it back rather than queue
behind the busy one holding it in its pool, yet a pool hit still beats a tier hit; a worker on another node
counts only its pool, and one that has reported nothing counts nothing."""

from pathlib import Path

from fleetctl.domain import WorkerRole, WorkerState
from fleetctl.engine.core.block_hash import chain_hashes
from fleetctl.engine.core.kv_tiers.file_tier import record_path
from fleetctl.engine.core.kv_tiers.presence import TIER_TOKEN_COST, TierPresence
from fleetctl.engine.core.output import TextStream
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.fleet.dispatch import cached_tokens
from fleetctl.engine.fleet.request import TrackedRequest
from fleetctl.engine.fleet.router import Router
from fleetctl.engine.fleet.worker_view import WorkerView
from fleetctl.tests.fleet.test_kv_routing import ROOT, TURN1, TURN2, worker


def request(tokens: list[int]) -> TrackedRequest:
    return TrackedRequest("req", tokens, SamplingParams(), 0, TextStream.__new__(TextStream))


def tiers_holding(tmp_path: Path, tokens: list[int]) -> TierPresence:
    for digest in chain_hashes(ROOT, tokens, 16):
        record_path(tmp_path, digest).write_bytes(b"block")
    return TierPresence((tmp_path,))


def test_tier_blocks_after_the_pool_count_at_a_discount(tmp_path: Path) -> None:
    tiers = tiers_holding(tmp_path, TURN1)  # 20 blocks
    cached = cached_tokens(request(TURN2), tiers)
    part = worker("prefill-0", WorkerRole.PREFILL, holds=TURN1[:160])
    empty = worker("prefill-1", WorkerRole.PREFILL, holds=[])
    assert cached(part) == 160 + (1 - TIER_TOKEN_COST) * 160
    assert cached(empty) == (1 - TIER_TOKEN_COST) * 320
    assert cached_tokens(request(TURN2))(part) == 160  # without tiers: the pool only
    assert cached(WorkerView("prefill-2", WorkerRole.PREFILL, "cpu:2", state=WorkerState.RUNNING)) == 0
    remote = worker("prefill-3", WorkerRole.PREFILL, holds=TURN1[:160])
    remote.node = "node2"
    assert cached(remote) == 160
    # the block holding the prompt's last token is computed whatever holds it: not counted from the tiers
    assert cached_tokens(request(TURN1), tiers)(empty) == (1 - TIER_TOKEN_COST) * 304


def test_an_idle_worker_reading_the_prefix_from_a_tier_beats_queueing_behind_the_pool_that_holds_it(
        tmp_path: Path) -> None:
    busy = worker("prefill-0", WorkerRole.PREFILL, holds=TURN1, sessions=2, backlog=300)
    idle = worker("prefill-1", WorkerRole.PREFILL, holds=[])
    req = request(TURN2)
    # without tiers: 300 + 100 tokens on prefill-0 against all 420 on prefill-1
    assert Router().pick_prefill_worker([busy, idle], num_tokens=len(TURN2),
                                        cached=cached_tokens(req)).worker_id == "prefill-0"
    tiers = tiers_holding(tmp_path, TURN1)
    assert Router().pick_prefill_worker([busy, idle], num_tokens=len(TURN2),
                                        cached=cached_tokens(req, tiers)).worker_id == "prefill-1"
    # idle both: the pool hit is cheaper than the tier's
    free = worker("prefill-0", WorkerRole.PREFILL, holds=TURN1)
    assert Router().pick_prefill_worker([free, idle], num_tokens=len(TURN2),
                                        cached=cached_tokens(req, tiers)).worker_id == "prefill-0"
