"""Split regret: how much goodput the current layout loses against the best one, over time. Every interval (with a
metrics store) the planner replays the window just past in a thread, as `--autoplan` does, and keeps the current
layout's goodput as a share of the recommended layout's — 1.0 when the current one is the best — with the best
layout's name; /fleet/status serves the newest and the series (`split_regret`), the console's pool panels draw
them. A window the planner cannot replay (too few requests, no steps yet) adds no point. The newest replay itself
is kept (`fresh_plan`): `/fleet/plan` asked the same question (the last 5 minutes, the default SLOs, this fleet's
workers) answers with it, so the plan screen and the pool panels give one answer, not two replays' answers.

Each replay's advice (planner/advice.py: move only when a layout's goodput band clears the current one's) is given
the layout the previous advice held, so a move once advised holds until the evidence says otherwise: the advice
does not flip with each replay's noise."""

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fleetctl.domain import WorkerState
from fleetctl.engine.fleet.state import FleetState
from fleetctl.engine.planner.advice import Advice
from fleetctl.engine.planner.plan import Plan, PlanRequest, plan_from_store
from fleetctl.engine.planner.simulator import EngineLimits
from fleetctl.engine.planner.split import Split
from fleetctl.errors import UserError
from fleetctl.store.plan_inputs import LiveWorker

REGRET_WINDOW_S = 300.0  # the replayed window: the console's five minutes
KEPT_POINTS = 60


@dataclass(frozen=True)
class RegretPoint:
    at: float  # time.time() of the replay
    ratio: float  # the current layout's goodput over the best layout's (0 when the current one serves nothing)
    current: str  # layout labels, as `plan` names them ("2:1", "colocated 3")
    best: str
    advice: Advice  # the replay's advice, word for word what the plan screen shows


def regret_point(plan: Plan, at: float) -> RegretPoint | None:
    """The point of one advised replay, or None when the current layout was not among those replayed."""
    now = plan.candidate(plan.current)
    if now is None or plan.current is None or plan.advice is None:
        return None
    best = plan.recommended
    ratio = 1.0 if best.goodput <= 0 else min(1.0, now.goodput / best.goodput)
    return RegretPoint(at, ratio, plan.current.label, best.split.label, plan.advice)


class SplitRegret:
    def __init__(self, state: FleetState, store_path: Path, interval_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        engine = state.config.engine
        self.state = state
        self.store_path = store_path
        self.interval_s = interval_s
        self.clock = clock
        self.request = PlanRequest(limits=EngineLimits(engine.max_num_seqs, engine.max_num_batched_tokens))
        self.points: deque[RegretPoint] = deque(maxlen=KEPT_POINTS)
        self.latest: tuple[float, Plan] | None = None  # the newest replay and its time.time()
        self.held: tuple[Split, float] | None = None  # the layout the advice says to move to, since when

    def fresh_plan(self) -> tuple[float, Plan] | None:
        """The newest replay while it is the current one (no newer one is due yet), with its time."""
        if self.latest is None or self.clock() - self.latest[0] > 2 * self.interval_s:
            return None
        return self.latest

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.step()

    async def step(self) -> RegretPoint | None:
        workers = [LiveWorker(v.worker_id, v.role, v.device) for v in self.state.views.values()
                   if v.state is WorkerState.RUNNING]
        now = self.clock()
        try:
            plan = await asyncio.to_thread(plan_from_store, self.store_path, REGRET_WINDOW_S, self.request, workers,
                                           now)
        except UserError:
            return None
        plan = plan.advised(*(self.held or (None, None)), at=now)
        self.held = plan.advice.held if plan.advice else None
        self.latest = (now, plan)
        point = regret_point(plan, now)
        if point is not None:
            self.points.append(point)
        return point
