"""Split regret on a fleet of fakes over a synthetic store: a replay of the last 5 minutes gives the current
layout's goodput as a share of the best layout's (the planner's own numbers for the same window), kept as a series
that /fleet/status serves (`split_regret`); /fleet/plan asked the same question answers with that replay, its advice
word for word the regret's; a window with no requests adds no point."""

from pathlib import Path

import pytest
from support.fake_workers import FakeLauncher, run_fleet
from support.fleet_checks import shm
from support.synthetic_fleet import TrueCosts, workload, write_store

from fleetctl.engine.api.reports import layout_label
from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.fleet.ops.split_regret import REGRET_WINDOW_S
from fleetctl.engine.planner.plan import plan_from_store
from fleetctl.engine.planner.split import Split
from fleetctl.errors import UserError
from fleetctl.store.plan_inputs import LiveWorker


def test_the_current_layouts_share_of_the_best_goodput_is_replayed_and_served(tiny_model_dir: Path,
                                                                              tmp_path: Path) -> None:
    store = tmp_path / "fleet.db"
    # prompt-heavy traffic through 1 prefill + 1 decode worker: the prefill worker queues, colocated does better
    end = write_store(store, workload("rag", 90, 1.0), TrueCosts(), t0=1_000_000.0)
    clock = [end + 1]

    async def scenario(fleet: Fleet, _: FakeLauncher) -> None:
        regret = fleet.split_regret
        assert regret is not None and fleet.status().split_regret is None  # nothing replayed yet
        regret.clock = lambda: clock[0]
        point = await regret.step()
        assert point is not None and point.current == "1:1"
        workers = [LiveWorker(v.worker_id, v.role, v.device) for v in fleet.state.views.values()]
        plan = plan_from_store(store, REGRET_WINDOW_S, regret.request, workers, clock[0])
        current = plan.candidate(plan.current)
        assert current is not None and point.best == plan.recommended.split.label
        assert point.ratio == pytest.approx(current.goodput / plan.recommended.goodput) and point.ratio < 1
        shared = await fleet.plan("5m", ("2s", "200ms"), None, False)  # the plan screen's default question
        best = shared.recommended
        assert layout_label(best.prefill, best.decode, best.mixed) == point.best
        assert shared.requests == plan.as_json()["requests"] and shared.notes[-1].startswith("the split regret's")
        regret_line = fleet.status().split_regret
        assert shared.advice is not None and regret_line is not None  # one replay, one advice, the same words
        assert (regret_line.verdict, regret_line.target, regret_line.advice) == (
            shared.advice.verdict, shared.advice.layout, shared.advice.sentence)
        assert shared.advice.verdict == "move" and regret.held == (Split(mixed=2), clock[0])
        with pytest.raises(UserError, match="no requests to replay"):  # another window: a replay of its own, on
            await fleet.plan("10m", ("2s", "200ms"), None, False)  # the real clock, long after this store's traffic
        clock[0] += 10
        await regret.step()
        status = fleet.status().split_regret
        assert status is not None and status.series == [round(point.ratio, 4)] * 2
        assert (status.current, status.best, status.at) == ("1:1", point.best, clock[0])
        assert regret.held == (Split(mixed=2), clock[0] - 10)  # the move holds since it was first advised
        assert status.advice.startswith("move to colocated 2 (advised since ")
        clock[0] += 2 * REGRET_WINDOW_S  # a window with no requests: nothing to replay, no point
        assert await regret.step() is None and len(regret.points) == 2

    run_fleet(tiny_model_dir, FakeLauncher(shm(tmp_path)), scenario, timeout=60.0, prefill=1, decode=1,
              devices=("cpu:0", "cpu:1"), store_path=store)
