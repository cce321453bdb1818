"""Elastic pools against in-process fake workers (tests/support/fake_workers.py): a fleet whose `--devices` list
more devices than it runs workers grows onto the free ones and shrinks off them by `rebalance`, sessions moved
live and every stream exact; and `--autoplan --max-workers` does it by itself on a scripted store and a fake
clock — out under a rising rate, back in when it falls, never two changes within the hysteresis."""

import json
import time
from itertools import pairwise
from pathlib import Path

import pytest
from support.fake_workers import FakeLauncher, run_fleet
from support.fleet_checks import all_complete, finished, nothing_leaked, prompts, shm, until
from support.synthetic_fleet import TrueCosts, workload, write_store

from fleetctl.domain import WorkerState
from fleetctl.engine.api.operations import OpState
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.fleet.errors import OperationRefused
from fleetctl.engine.fleet.ops.autoplan import Autoplanner
from fleetctl.engine.planner.autoplan_policy import Decision
from fleetctl.engine.planner.autoplan_settings import AutoplanSettings
from fleetctl.engine.planner.slo import Slo
from fleetctl.store.db import open_db

POOL = ("cpu:0", "cpu:1", "cpu:2", "cpu:3")
LONG = SamplingParams(max_tokens=150, temperature=0.0, ignore_eos=True)


def running(fleet: Fleet) -> dict[str, tuple[str, str]]:
    return {v.worker_id: (v.role.value, v.device) for v in fleet.views.values() if v.state is WorkerState.RUNNING}


def test_rebalance_grows_onto_free_devices_and_shrinks_with_sessions_moved_live(tiny_model_dir: Path,
                                                                                tmp_path: Path) -> None:
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        rebalancer = fleet.rebalancer
        assert rebalancer.free_devices() == ["cpu:2", "cpu:3"]
        with pytest.raises(OperationRefused, match=r"split 3:2 needs 5 devices and the fleet runs 2 \(cpu:0, cpu:1\); "
                                                   r"its free ones: cpu:2, cpu:3") as refused:
            rebalancer.start("3:2", False)
        assert refused.value.status == 400
        preview = rebalancer.preview("2:2", False)
        assert [(s.role, s.device) for s in preview.starts] == [("prefill", "cpu:2"), ("decode", "cpu:3")]
        assert preview.moves == [] and preview.stops == []
        first = [fleet.submit(p, LONG) for p in prompts(4)]
        grown = await finished(rebalancer.start("2:2", False))
        assert grown.state is OpState.DONE, grown.error
        assert [(s.worker, s.device) for s in grown.result.started] == [("prefill-1", "cpu:2"), ("decode-1", "cpu:3")]
        assert running(fleet) == {"prefill-0": ("prefill", "cpu:0"), "decode-0": ("decode", "cpu:1"),
                                  "prefill-1": ("prefill", "cpu:2"), "decode-1": ("decode", "cpu:3")}
        assert rebalancer.free_devices() == []
        second = [fleet.submit(p, LONG) for p in prompts(6, offset=40)]
        await until(lambda: all(len(fleet.views[w].requests) >= 1 for w in ("decode-0", "decode-1"))
                    and all(r.decode_worker for r in second))
        shrink = rebalancer.preview("1:1", False)
        assert shrink.moves == [] and shrink.starts == []
        [prefill_stop, decode_stop] = shrink.stops
        assert (prefill_stop.role, decode_stop.role) == ("prefill", "decode") and decode_stop.sessions >= 1
        shrunk = await finished(rebalancer.start("1:1", False))
        assert shrunk.state is OpState.DONE, shrunk.error
        [_, decoded] = shrunk.result.stopped
        assert decoded.worker == decode_stop.worker and decoded.sessions_moved >= 1  # moved live, not recomputed
        assert decoded.sessions_moved + decoded.sessions_finished == decode_stop.sessions
        assert len(running(fleet)) == 2 and sorted(rebalancer.free_devices()) == sorted(
            [prefill_stop.device, decode_stop.device])
        await all_complete(fleet, first + second)
        assert not any(r.recomputes for r in first + second)
        await nothing_leaked(fleet, launcher)
        fleet.state.recorder.writer.flush()
        db = open_db(fleet.config.store_path)
        events = [json.loads(d) for (d,) in db.execute("SELECT details FROM events WHERE kind = 'rebalance' "
                                                       "ORDER BY id")]
        assert [(e["from"], e["to"], len(e.get("started", [])), len(e.get("stopped", []))) for e in events] == [
            ("1:1", "2:2", 2, 0), ("2:2", "1:1", 0, 2)]

    run_fleet(tiny_model_dir, FakeLauncher(shm(tmp_path)), scenario, timeout=60.0, prefill=1, decode=1,
              devices=POOL, store_path=tmp_path / "fleet.db")


# agent-like traffic (short prompts, long answers): a quiet phase, a busy one, a quiet one, a window each minute;
# decode steps cheap enough that the store's own 1:1 fleet keeps up, and a TPOT objective one worker alone
# meets only while it is quiet
WINDOW_S, HYSTERESIS_S = 60.0, 150.0
PHASES = ((0.3, 3), (4.0, 4), (0.3, 4))  # (requests per second, windows)
COSTS = TrueCosts(decode=(0.01, 5e-4, 5e-7))
SLO = Slo(ttft_s=2.0, tpot_s=0.03)


def scripted_store(path: Path) -> float:
    """The phases' traffic through a 1 prefill + 1 decode fleet, ending now (the fleet's store keeps what is recent
    only); returns when it began."""
    requests, offset = [], 0.0
    for n, (rate, windows) in enumerate(PHASES):
        span = windows * WINDOW_S
        requests += [(offset + at, prompt, out) for at, prompt, out in workload("agent", int(rate * span) + 1, rate,
                                                                                  seed=n) if at < span]
        offset += span
    t0 = time.time() - offset - 60
    write_store(path, requests, COSTS, t0=t0)
    return t0


def test_autoplan_scales_out_under_a_rising_rate_and_back_in_within_its_hysteresis(tiny_model_dir: Path,
                                                                                  tmp_path: Path) -> None:
    store = tmp_path / "fleet.db"
    clock = [scripted_store(store)]
    settings = AutoplanSettings(interval_s=WINDOW_S, min_gain_pct=10.0, slo=SLO, max_workers=4,
                                hysteresis_s=HYSTERESIS_S)

    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        autoplan = Autoplanner(fleet.state, fleet.rebalancer, settings, clock=lambda: clock[0])
        sizes, changes = [], []
        for _ in range(sum(windows for _, windows in PHASES)):
            clock[0] += WINDOW_S
            verdict = await autoplan.step()
            if verdict.decision is Decision.APPLY:
                [op] = [op for op in fleet.operations.ops.values() if op.kind.value == "rebalance" and op.state
                        is OpState.RUNNING]
                assert (await finished(op)).state is OpState.DONE, op.error
                changes.append((clock[0], verdict.target))
            sizes.append(len(running(fleet)))
            assert verdict.decision is not Decision.SKIP, verdict.reason
        quiet, busy, after = sizes[:3], sizes[3:7], sizes[7:]
        assert max(busy) > quiet[-1] and after[-1] < max(busy), sizes  # out under the busy phase, back in after
        assert max(sizes) <= settings.max_workers
        times = [at for at, _ in changes]
        assert all(later - earlier >= HYSTERESIS_S for earlier, later in pairwise(times)), changes
        fleet.state.recorder.writer.flush()
        db = open_db(store)
        decisions = [json.loads(d)["decision"] for (d,) in db.execute("SELECT details FROM events WHERE kind = "
                                                                      "'plan' ORDER BY id")]
        assert decisions.count("apply") == len(changes) >= 2
        held = [json.loads(d)["reason"] for (d,) in db.execute("SELECT details FROM events WHERE kind = 'plan'")]
        assert any("waits out the 150 s hysteresis" in reason for reason in held), held

    run_fleet(tiny_model_dir, FakeLauncher(shm(tmp_path)), scenario, timeout=120.0, prefill=1, decode=1,
              devices=POOL, store_path=store)
