"""The controller under failures, against fake workers (tests/support/fake_workers.py): a request that raises is
retried on another worker and failed as poisoned after `max_retries`; dead workers are restarted with
backoff until the supervisor gives up; hung workers are killed; requests for a role no worker is left
for end at once; every request ends, with its tokens or one clear error, and nothing is leaked (KV
blocks on the survivors, buffers in shared memory). A fake's tokens depend only on prompt and position,
so a recomputed request must continue exactly where it stopped."""

import re
import time
from collections import Counter
from pathlib import Path

import pytest
from support.fake_workers import NUM_BLOCKS, FakeLauncher, Faults, run_fleet
from support.fleet_checks import all_complete, ends, nothing_leaked, prompts, shm, until

from fleetctl.domain import EventKind, WorkerRole, WorkerState
from fleetctl.engine.api.operations import OpKind
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.fleet.errors import NoWorkers
from fleetctl.engine.fleet.fleet_config import Supervision
from fleetctl.engine.worker import protocol as m

PARAMS = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
FAST = Supervision(backoff_s=0.05, heartbeat_s=0.05, heartbeat_timeout_s=0.5)


def events_of(fleet: Fleet) -> list[tuple[EventKind, str | None, dict]]:
    recorded: list[tuple[EventKind, str | None, dict]] = []
    fleet.state.record_event = lambda kind, wid, details: recorded.append((kind, wid, details))  # type: ignore
    return recorded


def test_a_request_that_raises_is_retried_on_another_worker_then_failed_as_poisoned(tiny_model_dir: Path,
                                                                                    tmp_path: Path) -> None:
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        poison = fleet.submit([9, 9, 9], PARAMS, request_id="poison-1")
        healthy = [fleet.submit(p, PARAMS) for p in prompts(6)]
        errors = await ends(fleet, [poison, *healthy])
        assert re.fullmatch(r"request poison-1 failed 3 times, on prefill-0, prefill-1 \(last: prefill-[01]: "
                            r"InjectedFault: fault injected at step\); it is treated as poisoned and not retried",
                            errors.pop("poison-1"))
        assert set(errors.values()) == {None}
        tries = Counter(wid for wid, w in launcher.workers.items() for msg in w.received
                        if isinstance(msg, m.RunRequest) and msg.request_id == "poison-1")
        assert sorted(tries.values()) == [1, 2] and set(tries) == {"prefill-0", "prefill-1"}  # retried elsewhere
        assert all(v.state is WorkerState.RUNNING for v in fleet.views.values())  # no worker lost to it
        await nothing_leaked(fleet, launcher)

    launcher = FakeLauncher(shm(tmp_path), faults=Faults(raise_on={"poison"}))
    run_fleet(tiny_model_dir, launcher, scenario, prefill=2, decode=1, supervision=FAST)


def test_a_request_that_kills_workers_is_failed_as_poisoned_and_the_workers_come_back(tiny_model_dir: Path,
                                                                                     tmp_path: Path) -> None:
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        recorded = events_of(fleet)
        poison = fleet.submit([9, 9, 9], PARAMS, request_id="poison-1")
        healthy = [fleet.submit(p, PARAMS) for p in prompts(6)]
        errors = await ends(fleet, [poison, *healthy])
        assert "failed 3 times, on prefill-0 (last: prefill-0 died serving it)" in errors.pop("poison-1")
        assert set(errors.values()) == {None}
        await until(lambda: fleet.views["prefill-0"].state is WorkerState.RUNNING)
        restarts = [details for kind, wid, details in recorded if kind is EventKind.RESTART]
        assert [r["attempt"] for r in restarts] == [1, 2, 3] and [r["backoff_s"] for r in restarts] == [0.05, 0.1, 0.2]
        await nothing_leaked(fleet, launcher)

    launcher = FakeLauncher(shm(tmp_path), faults=Faults(crash_on={"poison"}))
    run_fleet(tiny_model_dir, launcher, scenario, supervision=FAST)


def test_the_supervisor_backs_off_then_gives_up_and_says_so(tiny_model_dir: Path, tmp_path: Path) -> None:
    policy = Supervision(backoff_s=0.2, max_crashes=3, heartbeat_s=0.05, heartbeat_timeout_s=0.5)

    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        recorded = events_of(fleet)
        died = []
        for _ in range(2):
            old = launcher.workers["decode-0"]
            old.killed.set()
            await until(lambda: fleet.views["decode-0"].state is WorkerState.FAILED)
            died.append(time.monotonic())
            assert fleet.state.serves(fleet.views["decode-0"].role)  # requests may wait for the restart
            await until(lambda old=old: launcher.workers["decode-0"] is not old
                        and fleet.views["decode-0"].state is WorkerState.RUNNING)
            assert time.monotonic() - died[-1] >= 0.2 * len(died) - 0.05  # 0.2 s, then 0.4 s (seen late by <= 5 ms)
        req = fleet.submit(prompts(1)[0], SamplingParams(max_tokens=10_000, temperature=0.0, ignore_eos=True))
        await until(lambda: req.decode_worker == "decode-0" and len(req.output_token_ids) > 2)
        launcher.workers["decode-0"].killed.set()
        errors = await ends(fleet, [req])
        assert errors[req.request_id] == "no decode worker is left to continue this request"
        view = fleet.views["decode-0"]
        assert view.state is WorkerState.FAILED and "failed 3 times in 600 s; not restarted again" in view.last_error
        assert [kind for kind, *_ in recorded] == [EventKind.RESTART, EventKind.RESTART, EventKind.GAVE_UP]
        with pytest.raises(NoWorkers, match="no decode worker"):
            fleet.submit(prompts(1)[0], PARAMS)
        restarts = [op for op in fleet.operations.ops.values() if op.kind is OpKind.RESTART]
        assert [op.state.value for op in restarts] == ["done", "done"]

    run_fleet(tiny_model_dir, FakeLauncher(shm(tmp_path)), scenario, decode=1, devices=("cpu:0", "cpu:1"),
              supervision=policy)


def test_a_hung_worker_is_killed_its_sessions_recomputed_and_it_restarts(tiny_model_dir: Path,
                                                                          tmp_path: Path) -> None:
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        hung = launcher.workers["decode-0"]
        reqs = [fleet.submit(p, PARAMS) for p in prompts(6)]
        errors = await ends(fleet, reqs)
        assert set(errors.values()) == {None}
        assert hung.hung.is_set() and any(r.recomputes for r in reqs)
        await until(lambda: launcher.workers["decode-0"] is not hung
                    and fleet.views["decode-0"].state is WorkerState.RUNNING)
        await nothing_leaked(fleet, launcher)

    launcher = FakeLauncher(shm(tmp_path), faults=Faults(hang_after={"decode-0": 5}))
    run_fleet(tiny_model_dir, launcher, scenario, supervision=FAST)


@pytest.mark.parametrize("restart", [True, False])
def test_when_the_last_worker_of_a_role_dies_its_requests_wait_for_a_restart_or_end(tiny_model_dir: Path,
                                                                                    tmp_path: Path,
                                                                                    restart: bool) -> None:
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        reqs = [fleet.submit(p, PARAMS) for p in prompts(NUM_BLOCKS + 8)]  # some handoffs wait for room
        errors = await ends(fleet, reqs)
        if restart:
            assert set(errors.values()) == {None}
        else:  # decoding there, or waiting for room there: every one ends at once, with the reason
            assert set(errors.values()) == {"no decode worker is left to continue this request",
                                            "no decode worker is left to serve this request"}
        await nothing_leaked(fleet, launcher)

    launcher = FakeLauncher(shm(tmp_path), die_after={"decode-0": 3 * NUM_BLOCKS})
    run_fleet(tiny_model_dir, launcher, scenario, decode=1, devices=("cpu:0", "cpu:1"),
              supervision=Supervision(restart=restart, backoff_s=0.05))


@pytest.mark.parametrize("fault", ["prefill dies before publishing", "decode dies adopting"])
def test_a_worker_dying_in_the_middle_of_a_handoff_loses_nothing(tiny_model_dir: Path, tmp_path: Path,
                                                                 fault: str) -> None:
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        target = fleet.submit([9, 9, 9], PARAMS, request_id="target")
        reqs = [target, *(fleet.submit(p, PARAMS) for p in prompts(5))]
        errors = await ends(fleet, reqs)
        assert set(errors.values()) == {None} and target.recomputes + len(target.failed_on) >= 1
        await nothing_leaked(fleet, launcher)

    faults = (Faults(crash_before_publish={"target"}) if fault.startswith("prefill")
              else Faults(crash_on_adopt={"target"}))
    run_fleet(tiny_model_dir, FakeLauncher(shm(tmp_path), faults=faults), scenario, supervision=FAST)


def test_cancelling_frees_the_work_wherever_it_is(tiny_model_dir: Path, tmp_path: Path) -> None:
    long = SamplingParams(max_tokens=10_000, temperature=0.0, ignore_eos=True)

    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        fleet.dispatcher.router.config = type(fleet.dispatcher.router.config)(max_requests_per_worker=2)
        running = [fleet.submit(p, long) for p in prompts(2)]
        queued = fleet.submit([9, 9, 9], long)
        assert queued in fleet.state.queued
        fleet.cancel(queued)
        assert queued not in fleet.state.queued and fleet.queue_length(WorkerRole.PREFILL) == 0
        await until(lambda: all(len(r.output_token_ids) > 3 for r in running))
        handed = next(r for r in running if r.decode_worker)
        fleet.cancel(handed)
        for req in running:
            fleet.cancel(req)
        assert all(r.finish_reason == "abort" for r in [queued, *running])
        await nothing_leaked(fleet, launcher)
        assert not any(isinstance(msg, m.RunRequest) and msg.request_id == queued.request_id
                       for w in launcher.workers.values() for msg in w.received)

    run_fleet(tiny_model_dir, FakeLauncher(shm(tmp_path)), scenario)


def test_messages_to_a_dead_worker_are_dropped(tiny_model_dir: Path, tmp_path: Path) -> None:
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        link = fleet.state.links["decode-1"]
        launcher.workers["decode-1"].killed.set()
        await until(lambda: link.closed)
        for i in range(1000):
            link.send(m.Abort(f"req-{i}"))
        assert link.queued <= 1  # at most the writer's wake-up marker

    run_fleet(tiny_model_dir, FakeLauncher(shm(tmp_path)), scenario, supervision=Supervision(restart=False))


def test_a_mixed_worker_dying_beside_prefill_and_decode_ones_loses_nothing(tiny_model_dir: Path,
                                                                          tmp_path: Path) -> None:
    """What a mixed worker decoded in place is recomputed on a worker that takes prompts and handed off, each
    stream completing with exactly its tokens; the fleet keeps serving with its prefill and decode workers."""
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        started = fleet.lifecycle.start("mixed", "cpu:3")
        await until(lambda: started.result is not None)
        long = SamplingParams(max_tokens=150, temperature=0.0, ignore_eos=True)
        reqs = [fleet.submit(p, long) for p in prompts(6)]
        await until(lambda: any(r.prefill_worker == "mixed-0" and len(r.output_token_ids) >= 2 for r in reqs))
        on_mixed = [r for r in reqs if r.prefill_worker == "mixed-0"]
        launcher.workers["mixed-0"].killed.set()
        await all_complete(fleet, reqs)
        assert all(r.recomputes >= 1 and r.prefill_worker != "mixed-0" for r in on_mixed)
        await all_complete(fleet, [fleet.submit(p, PARAMS) for p in prompts(3)])

    run_fleet(tiny_model_dir, FakeLauncher(shm(tmp_path)), scenario, supervision=Supervision(restart=False))
