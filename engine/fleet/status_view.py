"""The fleet as its readers see it, in the wire contract's models: `/fleet/status` and `/fleet/workers` (the
`status --json` and `workers --json` contract, each number rounded as it has always been), a worker's sessions,
the recent and live requests' timing breakdowns, the fleet's log lines, and `/health`. Built fresh from the
controller's state on every call."""

import os
import time
from enum import StrEnum

from fleetctl.domain import PHASES, WorkerRole, WorkerState
from fleetctl.engine.api.requests import RecentRequests
from fleetctl.engine.api.status import (
    FleetLogLines,
    FleetStatus,
    LogLineInfo,
    PoolInfo,
    SplitRegretInfo,
    StoreInfo,
    TierInfo,
    WorkerInfo,
    WorkerSessions,
)
from fleetctl.engine.fleet.dispatch import Dispatcher
from fleetctl.engine.fleet.imbalance import outlier
from fleetctl.engine.fleet.logs import FLEET
from fleetctl.engine.fleet.ops.split_regret import SplitRegret
from fleetctl.engine.fleet.state import FleetState
from fleetctl.engine.fleet.stats import BUSY_WINDOW_S
from fleetctl.errors import NotFound


class Health(StrEnum):
    OK = "ok"  # running workers take prompts and decode
    DEGRADED = "degraded"  # a phase has no running worker (one may be coming back)
    SHUTTING_DOWN = "shutting down"  # no new request is admitted


class StatusView:
    def __init__(self, state: FleetState, dispatcher: Dispatcher, split_regret: SplitRegret | None) -> None:
        self.state = state
        self.dispatcher = dispatcher
        self.split_regret = split_regret

    def health(self) -> Health:
        if self.state.closing:
            return Health.SHUTTING_DOWN
        return Health.OK if all(self.state.covers(phase) for phase in PHASES) else Health.DEGRADED

    def workers(self) -> list[WorkerInfo]:
        stats = self.state.stats
        rows = []
        for view in self.state.views.values():
            util = stats.utilization(view.worker_id)
            drafts = stats.drafts_of([view.worker_id])
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
                kv_dtype=view.kv_dtype,
                kv_tokens=view.kv.num_blocks * view.kv.block_size,
                free_blocks=view.kv.free,
                busy=round(util.busy, 4),
                mfu=round(util.mfu, 6),
                mbu=round(util.mbu, 6),
                tokens_per_s=round(util.tokens_per_s, 1),
                prefix_hit_ratio=round(stats.hit_ratio_of([view.worker_id]), 4),
                was=view.was,
                spec_acceptance=drafts.acceptance,
                spec_tokens_per_step=drafts.tokens_per_step,
                stalled_s=view.stalled_s(),
            ))
        return rows

    def status(self, model: str, url: str) -> FleetStatus:
        stats = self.state.stats
        workers = self.workers()
        pools = {}
        for role in self.roles():
            members = [w for w in workers if w.role == role.value and w.state == WorkerState.RUNNING.value]
            pool_ids = [w.id for w in workers if w.role == role.value]
            count = len(members) or 1
            pools[role.value] = PoolInfo(
                workers=len(members),
                busy=round(sum(w.busy for w in members) / count, 4),
                mfu=round(sum(w.mfu for w in members) / count, 6),
                mbu=round(sum(w.mbu for w in members) / count, 6),
                queue=self.dispatcher.queue_length(role),
                prefix_hit_ratio=round(stats.hit_ratio_of(pool_ids), 4),
                tier_tokens=stats.tier_tokens_of(pool_ids),
                spec_acceptance=stats.drafts_of(pool_ids).acceptance,
                spec_tokens_per_step=stats.drafts_of(pool_ids).tokens_per_step,
                outlier=outlier([w for w in members if w.stalled_s is None]),
                structured_requests=stats.structured_of(pool_ids),
            )
        return FleetStatus(model=model, url=url, pid=os.getpid(), window_s=BUSY_WINDOW_S, workers=workers,
                           pools=pools, local_prefills=stats.local_prefill_count, store=self._store(),
                           kv_tiers={tier: TierInfo(used_bytes=used, capacity_bytes=capacity)
                                     for tier, (used, capacity) in stats.tier_io.occupancy.items()},
                           split_regret=self._split_regret(), flow=stats.flow.summary())

    def roles(self) -> list[WorkerRole]:
        """The roles of its pools: those it started with, and any a worker has now (a switch adds mixed)."""
        present = set(self.state.config.roles) | {v.role for v in self.state.views.values() if not v.gone}
        return [role for role in WorkerRole if role in present]

    def sessions(self, worker_id: str) -> WorkerSessions:
        """The requests `worker_id` holds (prefilling, publishing or decoding them), oldest first."""
        view = self.state.views.get(worker_id)
        if view is None:
            raise NotFound(f"unknown worker {worker_id!r}")
        now, requests = time.time(), self.state.requests
        held = sorted((requests[rid] for rid in view.requests if rid in requests), key=lambda r: r.times.arrival)
        return WorkerSessions.model_validate({"worker": worker_id, "sessions": [
            {"id": r.request_id, "stage": r.stage.value, "prompt_tokens": len(r.prompt_token_ids),
             "output_tokens": len(r.output_token_ids), "age_s": round(now - r.times.arrival, 3)} for r in held]})

    def recent_requests(self, limit: int) -> RecentRequests:
        """The last `limit` finished requests' timing breakdowns (newest last), and each request in flight's so far
        with its stage (oldest first)."""
        records = list(self.state.stats.records)
        live = sorted(self.state.requests.values(), key=lambda r: r.times.arrival)
        return RecentRequests.model_validate({"requests": records[-limit:] if limit else [],
                                              "live": [{**req.record(), "stage": req.stage.value} for req in live]})

    def log_lines(self, source: str | None, since: int, limit: int) -> FleetLogLines:
        """The recent log lines of `source` (a worker id, "fleet", None: all) after `since`, the last `limit`,
        read fresh from the workers' files; `next` is the `since` that asks for newer ones."""
        if source is not None and source != FLEET and source not in self.state.views:
            raise NotFound(f"unknown worker {source!r}")
        logs = self.state.logs
        logs.poll()
        lines = [LogLineInfo(seq=ln.seq, time=ln.time, source=ln.source, level=ln.level.value, text=ln.text)
                 for ln in logs.lines(source, since, limit)]
        return FleetLogLines(lines=lines, next=max(since, logs.last_seq))

    def _split_regret(self) -> SplitRegretInfo | None:
        points = self.split_regret.points if self.split_regret is not None else ()
        if not points:
            return None
        newest = points[-1]
        advice = newest.advice
        return SplitRegretInfo(ratio=round(newest.ratio, 4), current=newest.current, best=newest.best, at=newest.at,
                               series=[round(point.ratio, 4) for point in points], verdict=advice.verdict.value,
                               target=advice.target.label, advice=advice.sentence)

    def _store(self) -> StoreInfo | None:
        path, recorder = self.state.config.store_path, self.state.recorder
        if path is None:
            return None
        failure = recorder.writer.health if recorder else None
        if failure is None:
            return StoreInfo(path=str(path), failing=False)
        return StoreInfo(path=str(path), failing=True, problem=failure.problem, error=failure.error,
                         failing_since=failure.since, kept_rows=failure.kept_rows)
