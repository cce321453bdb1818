"""Pool changes — start, drain, resume, stop, force-stop — against in-process fake workers
(tests/support/fake_workers.py): what each does, every refusal, and that no request is lost or fails
while workers leave under load. A fake's tokens depend only on the prompt and the position, so a
session recomputed on a peer must continue exactly where it stopped."""

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.fake_workers import FakeLauncher, run_fleet
from support.fleet_checks import all_complete, finished, prompts, shm, until

from fleetctl.domain import WorkerRole, WorkerState
from fleetctl.engine.api.operations import OpState
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.fleet.errors import OperationRefused
from fleetctl.engine.fleet.fleet_config import pinned_cores
from fleetctl.engine.fleet.ops.record import Operation
from fleetctl.engine.fleet.request import TrackedRequest
from fleetctl.engine.worker import protocol as m
from fleetctl.store.db import open_db

LONG = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)


def refused(call: Callable[[], Operation], status: int, message: str) -> None:
    with pytest.raises(OperationRefused, match=message) as error:
        call()
    assert error.value.status == status


def test_start_launches_a_worker_like_its_peers_and_routes_to_it(tiny_model_dir: Path, tmp_path: Path) -> None:
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        op = fleet.lifecycle.start("decode", "cpu:3")
        assert (op.kind.value, op.worker_id, op.device) == ("start", "decode-2", "cpu:3")
        stages = set()
        while op.state is OpState.RUNNING:
            stages.add(op.stage)
            await asyncio.sleep(0.005)
        assert op.state is OpState.DONE, op.error
        assert "loading model" in stages
        new, peer = launcher.workers["decode-2"], launcher.workers["decode-0"]
        assert op.result.model_dump() == {"worker": "decode-2", "role": "decode", "device": "cpu:3", "pid": new.pid,
                             "seconds": op.result.seconds, "load_s": op.result.load_s,
                             "out_of_service_s": op.result.seconds}
        assert op.result.load_s is not None and op.result.load_s <= op.result.seconds
        assert op.result.seconds >= 0.3
        view = fleet.views["decode-2"]
        assert (view.state, view.role, view.device, view.pid) == (WorkerState.RUNNING, WorkerRole.DECODE, "cpu:3",
                                                                  new.pid)
        assert new.spec.engine == peer.spec.engine and new.spec.model_dir == peer.spec.model_dir
        assert new.spec.store_path == peer.spec.store_path
        assert new.spec.cores == pinned_cores("cpu:3", {"cpu:0", "cpu:1", "cpu:2", "cpu:3"})
        reqs = [fleet.submit(p, LONG) for p in prompts(6)]
        await all_complete(fleet, reqs)
        assert {r.decode_worker for r in reqs} == {"decode-0", "decode-1", "decode-2"}

    run_fleet(tiny_model_dir, FakeLauncher(shm(tmp_path), load_s={"decode-2": 0.3}), scenario)


def test_start_refusals_change_nothing(tiny_model_dir: Path, tmp_path: Path) -> None:
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        before = {wid: view.state for wid, view in fleet.views.items()}
        refused(lambda: fleet.lifecycle.start("gpu", "cpu:3"), 400, "unknown role 'gpu'")
        refused(lambda: fleet.lifecycle.start("decode", "gpu:0"), 400, "unknown device")
        refused(lambda: fleet.lifecycle.start("decode", "cpu"), 400, "cpu:N or cuda:N")
        refused(lambda: fleet.lifecycle.start("decode", "cuda:99"), 400, "does not exist")
        refused(lambda: fleet.lifecycle.start("decode", "cpu:1"), 409, "cpu:1 already hosts decode-0")
        assert not fleet.operations.ops and {w: v.state for w, v in fleet.views.items()} == before
        first = fleet.lifecycle.start("decode", "cpu:3")
        refused(lambda: fleet.lifecycle.start("prefill", "cpu:3"), 409, "cpu:3 is the target of another operation")
        second = fleet.lifecycle.start("decode", "cpu:4")
        assert (first.worker_id, second.worker_id) == ("decode-2", "decode-3")
        assert (await finished(first)).state is OpState.DONE and (await finished(second)).state is OpState.DONE
        refused(lambda: fleet.lifecycle.start("prefill", "cpu:3"), 409, "cpu:3 already hosts decode-2")

    run_fleet(tiny_model_dir, FakeLauncher(shm(tmp_path), load_s={"decode-2": 0.2}), scenario)


def test_a_prefill_worker_beside_mixed_ones_hands_its_prompts_to_them(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Roles side by side: the prompts spread over the prefill worker and the mixed ones (they take prompts
    too); what the prefill worker prefilled decodes on a mixed worker (they take handoffs too)."""
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        op = await finished(fleet.lifecycle.start("prefill", "cpu:2"))
        assert op.state is OpState.DONE and op.result.worker == "prefill-0"
        reqs = [fleet.submit(p, LONG) for p in prompts(3)]
        await all_complete(fleet, reqs)
        assert {r.prefill_worker for r in reqs} == {"mixed-0", "mixed-1", "prefill-0"}
        [handed] = [r for r in reqs if r.prefill_worker == "prefill-0"]
        assert handed.decode_worker in ("mixed-0", "mixed-1") and handed.error is None
        assert all(len(r.output_token_ids) == LONG.max_tokens for r in reqs)

    run_fleet(tiny_model_dir, FakeLauncher(shm(tmp_path)), scenario, colocated=2, devices=("cpu:0", "cpu:1"))


def test_a_start_whose_process_exits_leaves_nothing_behind(tiny_model_dir: Path, tmp_path: Path) -> None:
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        op = await finished(fleet.lifecycle.start("decode", "cpu:3"))
        assert op.state is OpState.FAILED and op.error == "the new decode-2 process on cpu:3 exited during startup"
        assert "decode-2" not in fleet.views and "decode-2" not in fleet.state.links
        again = await finished(fleet.lifecycle.start("decode", "cpu:3"))  # the device and the id are free again
        assert again.state is OpState.DONE and again.worker_id == "decode-2"

    run_fleet(tiny_model_dir, FakeLauncher(shm(tmp_path), fail_start={"decode-2"}), scenario)


def test_drain_finishes_what_the_worker_holds_and_routes_it_nothing_new(tiny_model_dir: Path,
                                                                        tmp_path: Path) -> None:
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        early = [fleet.submit(p, LONG) for p in prompts(8)]
        drained = fleet.views["decode-0"]
        await until(lambda: len(drained.requests) >= 2)
        held = len(drained.requests)
        called = time.monotonic()
        op = fleet.lifecycle.drain("decode-0")
        assert drained.state is WorkerState.DRAINING  # at once: nothing new is routed to it from here
        later = [fleet.submit(p, LONG) for p in prompts(4, offset=50)]
        await until(lambda: op.stage.startswith("draining: "))
        await all_complete(fleet, early + later)
        assert (await finished(op)).state is OpState.DONE
        wall = time.monotonic() - called
        assert op.result.model_dump() == {"worker": "decode-0", "sessions_finished": held, "seconds": op.result.seconds}
        assert 0 < op.result.seconds <= wall + 0.001  # it waited for the held sessions: not instant
        assert all(r.decode_worker == "decode-1" for r in later) and not any(r.recomputes for r in early + later)
        assert drained.state is WorkerState.DRAINING and not launcher.workers["decode-0"].conn.closed  # kept running

        resumed = fleet.lifecycle.resume("decode-0")
        assert drained.state is WorkerState.RUNNING
        assert (await finished(resumed)).result.model_dump() == {"worker": "decode-0", "cancelled_operation": None}
        again = [fleet.submit(p, LONG) for p in prompts(2, offset=90)]
        await all_complete(fleet, again)
        assert "decode-0" in {r.decode_worker for r in again}

    run_fleet(tiny_model_dir, FakeLauncher(shm(tmp_path)), scenario)


def test_resume_calls_off_a_drain_in_progress(tiny_model_dir: Path, tmp_path: Path) -> None:
    slow = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)

    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        reqs = [fleet.submit(p, slow) for p in prompts(4)]
        await until(lambda: len(fleet.views["decode-0"].requests) >= 1)
        drain = fleet.lifecycle.drain("decode-0")
        await until(lambda: drain.stage.startswith("draining: "))
        resume = fleet.lifecycle.resume("decode-0")
        assert (await finished(drain)).state is OpState.CANCELLED
        assert "decode-0 was resumed with" in drain.error and "left to drain" in drain.error
        assert (await finished(resume)).result.model_dump() == {"worker": "decode-0", "cancelled_operation": drain.id}
        assert fleet.views["decode-0"].state is WorkerState.RUNNING
        await all_complete(fleet, reqs)

    run_fleet(tiny_model_dir, FakeLauncher(shm(tmp_path)), scenario)


def test_stop_drains_then_shuts_the_worker_down(tiny_model_dir: Path, tmp_path: Path) -> None:
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        early = [fleet.submit(p, LONG) for p in prompts(8)]
        await until(lambda: len(fleet.views["decode-0"].requests) >= 2)
        held = len(fleet.views["decode-0"].requests)
        called = time.monotonic()
        op = fleet.lifecycle.stop("decode-0")
        later = [fleet.submit(p, LONG) for p in prompts(4, offset=50)]
        await all_complete(fleet, early + later)
        assert (await finished(op)).state is OpState.DONE, op.error
        wall = time.monotonic() - called
        assert op.result.model_dump() == {"worker": "decode-0", "sessions_finished": held, "sessions_moved": 0,
                             "seconds": op.result.seconds, "out_of_service_s": op.result.seconds}
        assert 0 < op.result.seconds <= wall + 0.001
        assert not any(r.recomputes for r in early + later) and all(r.decode_worker == "decode-1" for r in later)
        assert fleet.views["decode-0"].state is WorkerState.STOPPED
        fake = launcher.workers["decode-0"]
        assert fake.conn.closed and isinstance(fake.received[-1], m.Shutdown)

    run_fleet(tiny_model_dir, FakeLauncher(shm(tmp_path)), scenario)


def test_force_stop_moves_sessions_to_peers_at_once(tiny_model_dir: Path, tmp_path: Path) -> None:
    slow = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)

    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        reqs = [fleet.submit(p, slow) for p in prompts(6)]
        stopped = fleet.views["decode-0"]
        # at least one of them decoding there already (the others' KV may still be on the way to it)
        await until(lambda: len(stopped.requests) >= 2 and any(
            r.request_id in stopped.requests and r.times.second_token is not None for r in reqs))
        held = set(stopped.requests)
        op = await finished(fleet.lifecycle.stop("decode-0", force=True))
        assert op.state is OpState.DONE, op.error
        assert op.result.sessions_moved + op.result.sessions_finished == len(held)
        assert op.result.sessions_moved >= 1
        assert not any(r.done for r in reqs)  # it did not wait for them
        assert stopped.state is WorkerState.STOPPED and launcher.workers["decode-0"].conn.closed
        await all_complete(fleet, reqs)
        moved = [r for r in reqs if r.request_id in held]
        # recomputed from its tokens, or (its KV handoff was on the way to decode-0) handed to decode-1
        assert all(r.decode_worker == "decode-1" and r.recomputes <= 1 for r in moved)
        assert any(r.recomputes == 1 for r in moved)

    run_fleet(tiny_model_dir, FakeLauncher(shm(tmp_path)), scenario)


def test_force_stop_of_a_prefill_worker_recomputes_its_published_handoffs(tiny_model_dir: Path,
                                                                          tmp_path: Path) -> None:
    """More prompts than the one decode worker has blocks for: prefill workers hold prefilled sessions
    whose KV is published and waits for room. A prefill worker shut down removes that KV, so its
    handoffs are recomputed on the decode worker; no buffer is left behind."""
    short = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    buffers = shm(tmp_path)

    def waiting_on_prefill_0(fleet: Fleet) -> list[TrackedRequest]:
        return [r for r in fleet.state.pending_handoffs
                if not r.done and r.prefill_worker == "prefill-0" and r.decode_worker is None]

    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        reqs = [fleet.submit(p, short) for p in prompts(90)]
        await until(lambda: len(waiting_on_prefill_0(fleet)) >= 2)
        op = await finished(fleet.lifecycle.stop("prefill-0", force=True))
        assert op.state is OpState.DONE and op.result.sessions_moved >= 2
        assert not waiting_on_prefill_0(fleet)
        await all_complete(fleet, reqs)
        assert not list(buffers.iterdir())

    run_fleet(tiny_model_dir, FakeLauncher(buffers), scenario, prefill=2, decode=1)


def test_refusals_say_why_and_change_nothing(tiny_model_dir: Path, tmp_path: Path) -> None:
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        lifecycle = fleet.lifecycle

        def states() -> dict[str, WorkerState]:
            return {wid: view.state for wid, view in fleet.views.items()}

        def refused_unchanged(call: Callable[[], Operation], status: int, message: str) -> None:
            before, ops = states(), len(fleet.operations.ops)
            refused(call, status, message)
            assert states() == before and len(fleet.operations.ops) == ops

        for call in (lifecycle.drain, lifecycle.stop, lifecycle.resume):
            refused_unchanged(lambda call=call: call("decode-9"), 404, "unknown worker 'decode-9'")
        last_prefill = "cannot (drain|stop) prefill-0: it is the last running prefill worker"
        refused_unchanged(lambda: lifecycle.drain("prefill-0"), 409, last_prefill)
        refused_unchanged(lambda: lifecycle.stop("prefill-0", force=True), 409, last_prefill)
        refused_unchanged(lambda: lifecycle.resume("decode-0"), 409, "decode-0 is running, not draining")

        reqs = [fleet.submit(p, LONG) for p in prompts(6)]
        await until(lambda: len(fleet.views["decode-0"].requests) >= 1)
        drain = lifecycle.drain("decode-0")
        busy = f"another operation is running on decode-0 \\(drain {drain.id}\\)"
        refused_unchanged(lambda: lifecycle.drain("decode-0"), 409, busy)
        refused_unchanged(lambda: lifecycle.stop("decode-0", force=True), 409, busy)
        refused_unchanged(lambda: fleet.checkpoints.checkpoint("decode-0"), 409, busy)
        in_flight = "last running decode worker and [0-9]+ request\\(s\\) are in flight; resume decode-0 first"
        refused_unchanged(lambda: lifecycle.drain("decode-1"), 409, in_flight)
        refused_unchanged(lambda: lifecycle.stop("decode-1", force=True), 409, in_flight)
        await all_complete(fleet, reqs)
        assert (await finished(drain)).state is OpState.DONE
        refused_unchanged(lambda: lifecycle.stop("decode-1"), 409,
                          "cannot stop decode-1: .* the fleet would be left without a decode worker; resume decode-0")
        refused_unchanged(lambda: lifecycle.drain("decode-0"), 409, "decode-0 is draining, not running")

        stop = await finished(lifecycle.stop("decode-0"))  # a drained worker stops at once
        assert stop.state is OpState.DONE and stop.result.sessions_finished == 0
        refused_unchanged(lambda: lifecycle.stop("decode-0"), 409, "decode-0 is stopped, not running")
        refused_unchanged(lambda: lifecycle.drain("decode-0"), 409, "decode-0 is stopped, not running")
        refused_unchanged(lambda: lifecycle.resume("decode-0"), 409, "decode-0 is stopped, not draining")
        refused_unchanged(lambda: lifecycle.stop("decode-1"), 409, "start another decode worker first")
        await all_complete(fleet, [fleet.submit(p, LONG) for p in prompts(2)])  # still serving

    run_fleet(tiny_model_dir, FakeLauncher(shm(tmp_path)), scenario)


def test_a_worker_that_dies_while_draining_fails_the_drain_and_loses_nothing(tiny_model_dir: Path,
                                                                           tmp_path: Path) -> None:
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        reqs = [fleet.submit(p, LONG) for p in prompts(6)]
        await until(lambda: len(fleet.views["decode-0"].requests) >= 2)
        drain = fleet.lifecycle.drain("decode-0")
        await all_complete(fleet, reqs)
        assert (await finished(drain)).state is OpState.FAILED
        assert drain.error == "decode-0 failed while draining; its sessions were recomputed on peers"
        assert fleet.views["decode-0"].state is WorkerState.FAILED

    run_fleet(tiny_model_dir, FakeLauncher(shm(tmp_path), die_after={"decode-0": 20}), scenario)


def test_pool_changes_are_recorded_in_the_store(tiny_model_dir: Path, tmp_path: Path) -> None:
    store = tmp_path / "fleet.db"

    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        assert (await finished(fleet.lifecycle.start("decode", "cpu:3"))).state is OpState.DONE
        assert (await finished(fleet.lifecycle.drain("decode-0"))).state is OpState.DONE
        assert (await finished(fleet.lifecycle.resume("decode-0"))).state is OpState.DONE
        assert (await finished(fleet.lifecycle.stop("decode-1", force=True))).state is OpState.DONE

    run_fleet(tiny_model_dir, FakeLauncher(shm(tmp_path)), scenario, store_path=store)
    db = open_db(store)
    events = [(kind, worker, details) for kind, worker, details in db.execute(
        "SELECT kind, worker_id, details FROM events WHERE kind != 'start' OR worker_id = 'decode-2' ORDER BY id")]
    rows = {wid: (state, stopped) for wid, state, stopped in db.execute("SELECT id, state, stopped_at FROM workers")}
    db.close()
    assert [(kind, worker) for kind, worker, _ in events][:4] == [
        ("start", "decode-2"), ("drain", "decode-0"), ("resume", "decode-0"), ("stop", "decode-1")]
    assert '"sessions_finished": 0' in events[1][2] and '"cancelled_operation": null' in events[2][2]
    assert '"force": true' in events[3][2] and '"device": "cpu:2"' in events[3][2]
    assert rows["decode-1"][0] == "stopped" and rows["decode-1"][1] is not None
