"""`rebalance` and the autoplan task against in-process fake workers (tests/support/fake_workers.py): the moves, a
rebalance under load that loses no session (a fake's tokens depend only on the prompt and the position, so a
recomputed session continues exactly), every refusal, the store's events, and autoplan applying a split only
after two windows agree."""

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.fake_workers import FakeLauncher, Faults, run_fleet
from support.fleet_checks import all_complete, finished, nothing_leaked, prompts, shm, until
from support.synthetic_fleet import workload, write_store

from fleetctl.domain import Quantization, WorkerRole, WorkerState
from fleetctl.engine.api.operations import OpState
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.fleet.errors import OperationRefused
from fleetctl.engine.fleet.ops.autoplan import Autoplanner
from fleetctl.engine.planner.autoplan_policy import Decision
from fleetctl.engine.planner.autoplan_settings import AutoplanSettings
from fleetctl.store.db import open_db

LONG = SamplingParams(max_tokens=150, temperature=0.0, ignore_eos=True)


def roles(fleet: Fleet) -> dict[str, tuple[str, str]]:
    return {v.worker_id: (v.role.value, v.device) for v in fleet.views.values() if v.state is WorkerState.RUNNING}


def refused(call: Callable[[], object], status: int, message: str) -> None:
    with pytest.raises(OperationRefused, match=message) as error:
        call()
    assert error.value.status == status


@pytest.mark.parametrize(("force", "refuse_moves", "via"), [
    (False, False, None), (False, True, None), (True, False, None), (False, False, "restart")],
    ids=["moves-live", "moves-refused", "force", "moves-live-restart"])
def test_rebalance_under_load_loses_no_session(tiny_model_dir: Path, tmp_path: Path, force: bool,
                                               refuse_moves: bool, via: str | None) -> None:
    """Without --force the decode worker's sessions move to its peer live (no recompute); where the workers
    refuse live moves they finish in place instead; with --force they are recomputed on the peer. By default
    the worker switches role in place (the same process); --force, or --via restart, starts a new one."""
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        rebalancer = fleet.rebalancer
        switch = via is None and not force
        reqs = [fleet.submit(p, LONG) for p in prompts(8)]
        # every prompt handed off, so no session lands on the moved worker between the preview and the move
        await until(lambda: all(len(fleet.views[w].requests) >= 2 for w in ("decode-0", "decode-1"))
                    and sum(len(fleet.views[w].requests) for w in ("decode-0", "decode-1")) == len(reqs))
        preview = rebalancer.preview("2:1", force, via).model_dump()
        assert preview["current"] == "1:2" and preview["split"] == "2:1"
        assert preview["via"] == ("switch" if switch else "restart")
        assert [(m["worker"], m["from"], m["to"]) for m in preview["moves"]] in (
            [("decode-0", "decode", "prefill")], [("decode-1", "decode", "prefill")])
        moved = preview["moves"][0]
        fake = launcher.workers[moved["worker"]]
        op = rebalancer.start("2:1", force, via)
        assert (op.kind.value, op.worker_id) == ("rebalance", "fleet")
        later = [fleet.submit(p, LONG) for p in prompts(6, offset=40)]  # traffic keeps coming meanwhile
        stages = set()
        while op.state is OpState.RUNNING:
            stages.add(op.stage)
            await asyncio.sleep(0.005)
        assert op.state is OpState.DONE, op.error
        verb = "switch" if switch else "stop"
        assert any(s.startswith(f"1/1 {moved['worker']} on {moved['device']} -> prefill: {verb}") for s in stages)
        [done] = op.result.model_dump()["moves"]
        assert done["new_worker"] == "prefill-1" and done["device"] == moved["device"]
        assert (fleet.views["prefill-1"].pid == fake.pid) == switch  # switched: the same worker, under a new id
        if force:
            assert done["sessions_moved"] >= 1
        elif refuse_moves:
            assert (done["sessions_finished"], done["sessions_moved"]) == (moved["sessions"], 0)
        else:
            assert done["sessions_moved"] >= 1
            assert done["sessions_finished"] + done["sessions_moved"] == moved["sessions"]
        assert sorted(roles(fleet).values()) == [("decode", "cpu:1" if moved["device"] == "cpu:2" else "cpu:2"),
                                                 ("prefill", "cpu:0"), ("prefill", moved["device"])]
        await all_complete(fleet, reqs + later)
        assert any(r.recomputes for r in reqs) == force  # moved live or finished in place: never recomputed
        after = [fleet.submit(p, LONG) for p in prompts(4, 80)]
        assert "prefill-1" in {r.prefill_worker for r in later + after}
        await all_complete(fleet, after)
        await nothing_leaked(fleet, launcher)  # no block reserved or buffer published for a move is left

    launcher = FakeLauncher(shm(tmp_path), faults=Faults(refuse_moves=refuse_moves))
    run_fleet(tiny_model_dir, launcher, scenario, timeout=60.0)


def test_rebalance_refusals_change_nothing(tiny_model_dir: Path, tmp_path: Path) -> None:
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        rebalancer = fleet.rebalancer
        before = roles(fleet)
        refused(lambda: rebalancer.preview("2-1", False), 400, r"bad split '2-1': use PREFILL:DECODE, e.g. 2:1")
        refused(lambda: rebalancer.preview("0:3", False), 400, "leaves a role empty")
        refused(lambda: rebalancer.start("3:1", False), 400,
                r"split 3:1 needs 4 devices and the fleet runs 3 \(cpu:0, cpu:1, cpu:2\); it has no free one \(list "
                r"more with `serve --devices`\)")
        refused(lambda: rebalancer.start("1:2", False), 409, "the fleet is already at split 1:2")
        assert rebalancer.preview("1:2", False).moves == []
        # with force, the moved worker's sessions must fit in its peer's free blocks (none here, until it reports)
        reqs = [fleet.submit(p, LONG) for p in prompts(4)]
        await until(lambda: all(len(fleet.views[w].requests) >= 1 for w in ("decode-0", "decode-1")))
        for wid in ("decode-0", "decode-1"):
            fleet.views[wid].kv.reported(0)
        refused(lambda: rebalancer.start("2:1", True), 409,
                r"recomputing \d session\(s\) of decode-\d needs [1-9]\d* KV blocks and their peers have 0 free: "
                r"rebalance without --force")
        drain = fleet.lifecycle.drain("decode-1")
        refused(lambda: rebalancer.start("2:1", False), 409, r"another operation is running \(drain op-")
        await finished(drain)
        refused(lambda: rebalancer.start("2:1", False), 409, "decode-1 is draining: rebalance when every worker runs")
        assert not any(op.kind.value == "rebalance" for op in fleet.operations.ops.values())
        assert roles(fleet) == {k: v for k, v in before.items() if k != "decode-1"}
        await all_complete(fleet, reqs)

    run_fleet(tiny_model_dir, FakeLauncher(shm(tmp_path)), scenario)


def test_a_colocated_fleet_rebalances_to_a_split_by_switches(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Two mixed workers become 1:1 under streams: the first one's sessions move live to the second; the second,
    then the last worker that decodes, finishes them in place before it switches (no peer decodes). Every
    stream completes in full."""
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        reqs = [fleet.submit(p, LONG) for p in prompts(4)]
        preview = fleet.rebalancer.preview("1:1", False)
        assert [(c.from_, c.to) for c in preview.moves] == [("mixed", "prefill"), ("mixed", "decode")]
        op = await finished(fleet.rebalancer.start("1:1", False))
        assert op.state is OpState.DONE, op.error
        assert roles(fleet) == {"prefill-0": ("prefill", "cpu:0"), "decode-0": ("decode", "cpu:1")}
        await all_complete(fleet, reqs)
        assert all(r.error is None and len(r.output_token_ids) == LONG.max_tokens for r in reqs)
        refused(lambda: fleet.rebalancer.start("1:1", False), 409, "already at split 1:1")

    run_fleet(tiny_model_dir, FakeLauncher(shm(tmp_path)), scenario, colocated=2, devices=("cpu:0", "cpu:1"))


def test_a_failed_step_ends_the_rebalance_and_says_where_the_fleet_is(tiny_model_dir: Path, tmp_path: Path) -> None:
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        op = await finished(fleet.rebalancer.start("2:1", False, "restart"))
        assert op.state is OpState.FAILED
        assert op.error == ("start of prefill-1 failed: the new prefill-1 process on cpu:1 exited during startup "
                            "(the fleet is at 1:1 after 0 of 1 step(s))")

    run_fleet(tiny_model_dir, FakeLauncher(shm(tmp_path), fail_start={"prefill-1"}), scenario)


def test_a_failed_switch_ends_the_rebalance_with_the_worker_in_its_old_role(tiny_model_dir: Path,
                                                                           tmp_path: Path) -> None:
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        op = await finished(fleet.rebalancer.start("2:1", False))
        assert op.state is OpState.FAILED
        assert op.error == ("switch of decode-0 failed: the switch of decode-0 to prefill was called off: "
                            "InjectedFault: fault injected at switch; decode-0 is running as a decode worker "
                            "(the fleet is at 1:2 after 0 of 1 step(s))")
        assert roles(fleet) == {"prefill-0": ("prefill", "cpu:0"), "decode-0": ("decode", "cpu:1"),
                                "decode-1": ("decode", "cpu:2")}
        await all_complete(fleet, [fleet.submit(p, LONG) for p in prompts(4)])

    run_fleet(tiny_model_dir, FakeLauncher(shm(tmp_path), faults=Faults(fail_switch={"decode-0", "decode-1"})),
              scenario)


def test_via_switch_is_refused_where_it_cannot_keep_its_promise(tiny_model_dir: Path, tmp_path: Path) -> None:
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        refused(lambda: fleet.rebalancer.start("2:1", False, "teleport"), 400, "unknown --via 'teleport'")
        refused(lambda: fleet.rebalancer.start("2:1", True, "switch"), 400, "--force recomputes sessions")
        refused(lambda: fleet.rebalancer.preview("2:1", False, "switch"), 409, "serve different weight formats")
        assert fleet.rebalancer.preview("2:1", False).via == "restart"  # the default where formats differ

    run_fleet(tiny_model_dir, FakeLauncher(shm(tmp_path)), scenario,
              role_quantization=((WorkerRole.PREFILL, Quantization.NONE), (WorkerRole.DECODE, Quantization.INT4)))


def test_autoplan_applies_the_layout_after_two_windows_and_records_each_decision(tiny_model_dir: Path,
                                                                                 tmp_path: Path) -> None:
    """The store holds ten minutes of rag-like traffic measured on this fleet's devices (the fixture's prefill-0
    and decode-0): the planner wants colocated 3 where the fleet runs 1:2, and switches get it there."""
    store = tmp_path / "fleet.db"
    write_store(store, workload("rag", 60, 1.5), t0=time.time() - 600)

    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        autoplan = Autoplanner(fleet.state, fleet.rebalancer,
                               AutoplanSettings(interval_s=900.0, min_gain_pct=10.0))
        first = await autoplan.step()
        assert first.decision is Decision.WAIT and first.reason.startswith("colocated 3 would gain ")
        second = await autoplan.step()
        assert second.decision is Decision.APPLY and second.target is not None
        [op] = [op for op in fleet.operations.ops.values() if op.kind.value == "rebalance"]
        third = await autoplan.step()  # while it runs
        assert third.decision is Decision.SKIP and third.reason == f"an operation is running (rebalance {op.id})"
        assert (await finished(op)).state is OpState.DONE, op.error
        assert sorted(role for role, _ in roles(fleet).values()) == ["mixed", "mixed", "mixed"]
        fleet.state.recorder.writer.flush()
        db = open_db(store)
        events = db.execute("SELECT kind, details FROM events WHERE kind IN ('plan', 'rebalance') "
                            "ORDER BY id").fetchall()
        assert [(kind, json.loads(d).get("decision")) for kind, d in events] == [
            ("plan", "wait"), ("plan", "apply"), ("plan", "skip"), ("rebalance", None)]
        assert '"operation": "' + op.id in events[1][1] and '"to": "colocated 3"' in events[3][1]

    run_fleet(tiny_model_dir, FakeLauncher(shm(tmp_path)), scenario, timeout=60.0, store_path=store)


def test_a_worker_that_changes_role_loads_its_new_roles_weight_format(tiny_model_dir: Path, tmp_path: Path) -> None:
    """--prefill-quantization none --decode-quantization int4: the decode worker a rebalance turns into a prefill
    worker is started again with 16-bit weights, and a prefill worker turned decode with int4 ones."""
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        def formats() -> dict[str, Quantization]:
            return {wid: worker.spec.engine.quantization for wid, worker in launcher.workers.items()
                    if fleet.views.get(wid) and fleet.views[wid].state is WorkerState.RUNNING}

        assert formats() == {"prefill-0": Quantization.NONE, "decode-0": Quantization.INT4,
                             "decode-1": Quantization.INT4}
        await finished(fleet.rebalancer.start("2:1", False))
        assert formats() == {"prefill-0": Quantization.NONE, "prefill-1": Quantization.NONE,
                             "decode-0" if "decode-0" in formats() else "decode-1": Quantization.INT4}
        await finished(fleet.rebalancer.start("1:2", False))
        assert sorted(q.value for q in formats().values()) == ["int4", "int4", "none"]

    launcher = FakeLauncher(shm(tmp_path))
    run_fleet(tiny_model_dir, launcher, scenario, timeout=60.0,
              role_quantization=((WorkerRole.PREFILL, Quantization.NONE), (WorkerRole.DECODE, Quantization.INT4)))
