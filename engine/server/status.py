"""/fleet/status and /fleet/workers (the `status --json` and `workers --json` contract) built from the
controller's view, as the contract's models (`schemas.FleetStatus`, `schemas.WorkerInfo`)."""

import os

from fleetctl.domain import WorkerState
from fleetctl.engine.api.status import FleetStatus, PoolInfo, SplitRegretInfo, StoreInfo, TierInfo, WorkerInfo
from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.fleet.stats import BUSY_WINDOW_S


def workers_status(fleet: Fleet) -> list[WorkerInfo]:
    rows = []
    for view in fleet.views.values():
        util = fleet.stats.utilization(view.worker_id)
        rows.append(WorkerInfo(
            id=view.worker_id,
            role=view.role.value,
            device=view.device,
            node=view.node or None,  # a Ray fleet's node (None: this machine)
            node_lost=view.node_lost,  # the process ended because the cluster lost its node
            state=view.state.value,
            pid=None if view.gone else view.pid,  # a stopped or failed worker's process is gone (reaped)
            sessions=len(view.requests),
            kv_usage=round(view.kv.usage, 4),
            kv_blocks=view.kv.num_blocks,
            weights=view.weights,
            free_blocks=view.kv.free,
            busy=round(util.busy, 4),
            mfu=round(util.mfu, 6),
            mbu=round(util.mbu, 6),
            tokens_per_s=round(util.tokens_per_s, 1),
            prefix_hit_ratio=round(fleet.stats.hit_ratio_of([view.worker_id]), 4),
            was=view.was,
        ))
    return rows


def fleet_status(fleet: Fleet) -> FleetStatus:
    workers = workers_status(fleet)
    pools = {}
    for role in fleet.roles():
        members = [w for w in workers if w.role == role.value and w.state == WorkerState.RUNNING.value]
        count = len(members) or 1
        pools[role.value] = PoolInfo(
            workers=len(members),
            busy=round(sum(w.busy for w in members) / count, 4),
            mfu=round(sum(w.mfu for w in members) / count, 6),
            mbu=round(sum(w.mbu for w in members) / count, 6),
            queue=fleet.queue_length(role),
            prefix_hit_ratio=round(fleet.stats.hit_ratio_of([w.id for w in workers if w.role == role.value]), 4),
            tier_tokens=fleet.stats.tier_tokens_of([w.id for w in workers if w.role == role.value]),
        )
    return FleetStatus(model=fleet.model_name, url=fleet.url, pid=os.getpid(), window_s=BUSY_WINDOW_S,
                       workers=workers, pools=pools, local_prefills=fleet.stats.local_prefill_count,
                       store=store_info(fleet),
                       kv_tiers={tier: TierInfo(used_bytes=used, capacity_bytes=capacity)
                                 for tier, (used, capacity) in fleet.stats.tier_io.occupancy.items()},
                       split_regret=split_regret_info(fleet))


def split_regret_info(fleet: Fleet) -> SplitRegretInfo | None:
    points = fleet.split_regret.points if fleet.split_regret is not None else ()
    if not points:
        return None
    newest = points[-1]
    return SplitRegretInfo(ratio=round(newest.ratio, 4), current=newest.current, best=newest.best, at=newest.at,
                           series=[round(point.ratio, 4) for point in points])


def store_info(fleet: Fleet) -> StoreInfo | None:
    path = fleet.config.store_path
    if path is None:
        return None
    failure = fleet.store_failure
    if failure is None:
        return StoreInfo(path=str(path), failing=False)
    return StoreInfo(path=str(path), failing=True, problem=failure.problem, error=failure.error,
                     failing_since=failure.since, kept_rows=failure.kept_rows)
