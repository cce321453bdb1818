"""`serve --autoplan`: once per interval, plan over the interval just past (in a thread: the replay is
CPU work) and ask the policy (`planner.autoplan_policy`) whether to rebalance; every decision, applied or
not, is a `plan` event in the store with its reason and numbers. With `--max-workers N` the plan is elastic
over the fleet's devices and up to N of its pool's, so a rebalance may start workers on free devices or stop
idle ones."""

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace

from fleetctl.domain import EventKind, WorkerState
from fleetctl.engine.fleet.errors import OperationRefused
from fleetctl.engine.fleet.ops.rebalance import Rebalancer
from fleetctl.engine.fleet.state import FleetState
from fleetctl.engine.planner.autoplan_policy import AutoplanPolicy, Decision, Verdict
from fleetctl.engine.planner.autoplan_settings import AutoplanSettings
from fleetctl.engine.planner.plan import PlanRequest, plan_from_store
from fleetctl.engine.planner.simulator import EngineLimits
from fleetctl.errors import UserError
from fleetctl.store.plan_inputs import LiveWorker


class Autoplanner:
    def __init__(self, state: FleetState, rebalancer: Rebalancer, settings: AutoplanSettings,
                 clock: Callable[[], float] = time.time) -> None:
        """`clock`: wall-clock seconds, as the store's windows are counted (a test's own)."""
        assert state.config.store_path is not None  # FleetConfig requires one with autoplan
        self.state = state
        self.store_path = state.config.store_path
        self.rebalancer = rebalancer
        self.settings = settings
        self.clock = clock
        self.policy = AutoplanPolicy(settings, clock)
        engine = state.config.engine
        self.request = PlanRequest(slo=settings.slo, limits=EngineLimits(engine.max_num_seqs,
                                                                         engine.max_num_batched_tokens))

    def plan_request(self) -> PlanRequest:
        """Elastic with `max_workers`: over the live workers' devices and free ones of the pool, up to the cap."""
        limit = self.settings.max_workers
        devices = None if limit is None else self.rebalancer.elastic_devices(limit)
        if devices is None:
            return self.request
        return replace(self.request, devices=",".join(devices), elastic=True)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.settings.interval_s)
            await self.step()

    async def step(self) -> Verdict:
        """One window: plan, decide, maybe start a rebalance, record the decision."""
        details: dict[str, object] = {}
        busy = self.rebalancer.running_operation()
        if busy is not None:
            verdict = self.policy.skip(f"an operation is running ({busy.kind.value} {busy.id})")
        else:
            workers = [LiveWorker(v.worker_id, v.role, v.device) for v in self.state.views.values()
                       if v.state is WorkerState.RUNNING]
            try:
                plan = await asyncio.to_thread(plan_from_store, self.store_path, self.settings.interval_s,
                                               self.plan_request(), workers, self.clock())
            except UserError as exc:
                verdict = self.policy.skip(str(exc))
            else:
                verdict = self.policy.judge(plan)
                details = {"current": plan.current.label if plan.current else None,
                           "recommended": plan.recommended.split.label,
                           "gain_pct": plan.gain_json(),
                           "goodput": {c.split.label: round(c.goodput, 4) for c in plan.candidates},
                           "requests": plan.recommended.requests}
        if verdict.decision is Decision.APPLY:
            assert verdict.target is not None
            try:
                details["operation"] = self.rebalancer.start(verdict.target, force=False).id
                self.policy.applied()
            except OperationRefused as exc:
                verdict = self.policy.skip(f"rebalance to {verdict.target.label} refused: {exc}")
        self.state.record_event(EventKind.PLAN, None, {"decision": verdict.decision.value, "reason": verdict.reason,
                                                       **details})
        return verdict
