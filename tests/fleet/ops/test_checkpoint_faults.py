"""Checkpoint, restore and migrate when something goes wrong, against fake workers that write real v1
checkpoints (tests/support/fake_checkpoints.py): held sessions are never stranded by a failed restore, a
checkpoint that is not written in time is called off (the worker serves on, a migration's standby is
reaped), handoffs parked on a stood-down prefill worker continue, and a restore that would replay
sessions is refused unless forced."""

import asyncio
from pathlib import Path

import pytest
from support.fake_workers import NUM_BLOCKS, FakeLauncher, Faults, run_fleet
from support.fleet_checks import ends, nothing_leaked, prompts, shm, until

from fleetctl.domain import WorkerState
from fleetctl.engine.api.operations import OpState
from fleetctl.engine.checkpoint.format import used_at
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.fleet.errors import OperationRefused
from fleetctl.engine.fleet.fleet_config import Supervision
from fleetctl.engine.fleet.ops.checkpoint_catalog import catalog
from fleetctl.engine.fleet.ops.record import Operation

PARAMS = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
LONG = SamplingParams(max_tokens=600, temperature=0.0, ignore_eos=True)  # still running after a checkpoint


async def finished(op: Operation) -> Operation:
    await until(lambda: op.state is not OpState.RUNNING, lambda: f"{op.kind.value} still {op.stage}")
    return op


async def stood_down(fleet: Fleet, worker: str, hold_s: float) -> Path:
    op = await finished(fleet.checkpoints.checkpoint(worker, hold_s))
    assert op.state is OpState.DONE, op.error
    assert fleet.views[worker].state is WorkerState.CHECKPOINTED
    return Path(op.result.checkpoint)


@pytest.mark.parametrize("hold_runs_out", ["during the restore", "after it"])
def test_a_failed_restore_leaves_no_held_session_stranded(tiny_model_dir: Path, tmp_path: Path,
                                                          hold_runs_out: str) -> None:
    hold = 0.3 if hold_runs_out == "during the restore" else 2.0

    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        reqs = [fleet.submit(p, LONG) for p in prompts(4)]
        await until(lambda: all(r.decode_worker and len(r.output_token_ids) > 2 for r in reqs))
        path = await stood_down(fleet, "decode-0", hold)
        launcher.faults.load_s["decode-0"] = 0.5  # the standby loads a while: a short hold runs out meanwhile
        held = [r for r in reqs if r.decode_worker == "decode-0"]
        assert held and not any(r.done for r in held)
        op = await finished(await fleet.restores.restore(path.name, "cpu:3"))
        assert op.state is OpState.FAILED and "fault injected at restore" in op.error
        assert used_at(path) is None  # not restored: the same checkpoint may be tried again
        errors = await ends(fleet, reqs)  # recomputed on decode-1 once the hold ran out
        assert set(errors.values()) == {None} and all(r.recomputes for r in held)
        assert fleet.views["decode-0"].state is WorkerState.STOPPED
        await nothing_leaked(fleet, launcher)

    run_fleet(tiny_model_dir, FakeLauncher(shm(tmp_path), faults=Faults(fail_restore={"decode-0"})), scenario)


def test_a_checkpoint_not_written_in_time_is_called_off_and_the_migration_reaped(tiny_model_dir: Path,
                                                                                 tmp_path: Path) -> None:
    """A prefill worker migrates through a checkpoint (its sessions wait for their handoff)."""

    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        reqs = [fleet.submit(p, PARAMS) for p in prompts(6)]
        source = launcher.workers["prefill-0"]
        op = await finished(fleet.migrations.migrate("prefill-0", "cpu:3"))
        assert op.state is OpState.FAILED
        assert op.error == ("checkpoint of prefill-0 failed: not written within 0.5 s; the writer was killed; the "
                            "source resumed on cpu:0, nothing was lost")
        standby = launcher.workers["prefill-0"]
        assert standby is not source and standby.conn.closed  # the standby was shut down and reaped
        assert fleet.state.links["prefill-0"].launched.process.pid == source.pid
        assert fleet.views["prefill-0"].state is WorkerState.RUNNING
        errors = await ends(fleet, reqs)
        assert set(errors.values()) == {None}
        again = await finished(fleet.checkpoints.checkpoint("prefill-0", 30))
        assert again.state is OpState.FAILED and fleet.views["prefill-0"].state is WorkerState.RUNNING
        await nothing_leaked(fleet, launcher)

    launcher = FakeLauncher(shm(tmp_path), faults=Faults(checkpoint_s={"prefill-0": 30.0}))  # every incarnation
    run_fleet(tiny_model_dir, launcher, scenario, supervision=Supervision(checkpoint_timeout_s=0.5))


@pytest.mark.parametrize("outcome", ["restored", "hold runs out"])
def test_handoffs_parked_on_a_stood_down_prefill_worker_continue(tiny_model_dir: Path, tmp_path: Path,
                                                                 outcome: str) -> None:
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        endless = SamplingParams(max_tokens=100_000, temperature=0.0, ignore_eos=True)
        fillers = [fleet.submit(p, endless) for p in prompts(NUM_BLOCKS)]  # the decode worker is full
        await until(lambda: all(r.decode_worker for r in fillers))
        parked = [fleet.submit([9, 9, i], PARAMS) for i in range(6)]
        await until(lambda: len(fleet.state.pending_handoffs) == len(parked))
        path = await stood_down(fleet, "prefill-0", 30.0 if outcome == "restored" else 0.2)
        if outcome == "restored":
            op = await finished(await fleet.restores.restore(path.name, "cpu:3"))
            assert op.state is OpState.DONE, op.error
            assert op.result.checkpoint == str(path) and used_at(path)
        else:
            await until(lambda: fleet.views["prefill-0"].state is WorkerState.STOPPED)
        for filler in fillers[: len(parked)]:
            fleet.cancel(filler)  # room for the parked ones
        errors = await ends(fleet, parked)
        assert set(errors.values()) == {None}
        for filler in fillers:
            fleet.cancel(filler)
        await nothing_leaked(fleet, launcher)

    run_fleet(tiny_model_dir, FakeLauncher(shm(tmp_path)), scenario, decode=1, devices=("cpu:0", "cpu:1"))


def test_a_restore_that_would_replay_sessions_is_refused_unless_forced(tiny_model_dir: Path, tmp_path: Path) -> None:
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        reqs = [fleet.submit(p, LONG) for p in prompts(4)]
        await until(lambda: all(r.decode_worker and len(r.output_token_ids) > 2 for r in reqs))
        older = await stood_down(fleet, "decode-0", 30)
        op = await finished(await fleet.restores.restore(older.name, "cpu:1"))
        assert op.state is OpState.DONE, op.error
        newer = await stood_down(fleet, "decode-0", 0.3)
        for checkpoint, why in ((older, "restored already"), (older.with_name("x"), "no checkpoint")):
            with pytest.raises(OperationRefused, match=why):
                await fleet.restores.restore(checkpoint.name, "cpu:1")
        rows = {row["name"]: row for row in await asyncio.to_thread(catalog)}
        assert rows[older.name]["used_at"] and rows[newer.name]["used_at"] is None
        assert rows[newer.name]["checkpoint"] == str(newer)
        await until(lambda: fleet.views["decode-0"].state is WorkerState.STOPPED)  # the hold ran out
        with pytest.raises(OperationRefused, match=r"session req-\w+ has progressed since .* \(it runs on decode-1"):
            await fleet.restores.restore(newer.name, "cpu:1")
        errors = await ends(fleet, reqs)
        assert set(errors.values()) == {None}
        with pytest.raises(OperationRefused, match=r"none of the \d+ session.* is in flight") as refused:
            await fleet.restores.restore(newer.name, "cpu:1")
        assert refused.value.status == 409 and "--force" in str(refused.value)
        forced = await finished(await fleet.restores.restore(newer.name, "cpu:1", force=True))
        assert forced.state is OpState.DONE and fleet.views["decode-0"].state is WorkerState.RUNNING
        await nothing_leaked(fleet, launcher)  # the replayed sessions were aborted: no client wants them

    run_fleet(tiny_model_dir, FakeLauncher(shm(tmp_path)), scenario, timeout=60)


def test_requests_wait_while_the_last_decode_worker_pauses_for_a_checkpoint(tiny_model_dir: Path,
                                                                             tmp_path: Path) -> None:
    """decode-0, the only decode worker, takes 2.5 s to write its checkpoint: requests whose KV is ready meanwhile
    wait for it (it comes back held, then restored), they do not fail as if no decode worker were left."""

    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        first = [fleet.submit(p, LONG) for p in prompts(2)]
        await until(lambda: all(r.decode_worker and r.output_token_ids for r in first))
        op = fleet.checkpoints.checkpoint("decode-0", 30)
        await until(lambda: fleet.views["decode-0"].state is WorkerState.DRAINING)
        later = [fleet.submit(p, PARAMS) for p in prompts(3, offset=40)]
        await asyncio.sleep(2.0)  # the once-a-second check for stranded requests runs meanwhile
        assert not any(r.done for r in [*first, *later])
        await finished(op)
        assert op.state is OpState.DONE, op.error
        restored = await finished(await fleet.restores.restore(Path(op.result.checkpoint).name, "cpu:2"))
        assert restored.state is OpState.DONE, restored.error
        errors = await ends(fleet, [*first, *later])
        assert set(errors.values()) == {None}, errors
        await nothing_leaked(fleet, launcher)

    launcher = FakeLauncher(shm(tmp_path), faults=Faults(checkpoint_s={"decode-0": 2.5}))
    run_fleet(tiny_model_dir, launcher, scenario, prefill=1, decode=1, devices=("cpu:0", "cpu:1"))
