"""The controller against in-process fake workers (tests/support/fake_workers.py): the request path
through prefill → handoff → decode, recovery when a decode worker dies, admission errors and
cancellation — no torch, no processes."""

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from support.fake_workers import NUM_BLOCKS, FakeLauncher, expected_tokens, run_fleet, tokens_of

from fleetctl.domain import WorkerRole, WorkerState
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.fleet.errors import FleetBusy, NoWorkers
from fleetctl.engine.fleet.fleet_config import Supervision
from fleetctl.engine.worker import protocol as m
from fleetctl.errors import NotFound

PROMPTS = [[5, 6, 7], [8, 9, 10, 11], [12, 13]]
PARAMS = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def run(model_dir: Path, tmp_path: Path, scenario: Callable[[Fleet, FakeLauncher], Awaitable[None]],
        die_after: dict[str, int] | None = None, **config: object) -> FakeLauncher:
    launcher = FakeLauncher(tmp_path, die_after)
    run_fleet(model_dir, launcher, scenario, **config)
    return launcher


def test_requests_flow_through_prefill_handoff_and_decode(tiny_model_dir: Path, tmp_path: Path) -> None:
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        reqs = [fleet.submit(p, PARAMS) for p in PROMPTS]
        results = await asyncio.gather(*(tokens_of(fleet, r) for r in reqs))
        for prompt, req, tokens in zip(PROMPTS, reqs, results, strict=True):
            assert tokens == expected_tokens(prompt, PARAMS.max_tokens)
            assert req.finish_reason == "length" and req.prefill_worker == "prefill-0"
            assert req.decode_worker in ("decode-0", "decode-1") and req.times.handoff_bytes == 4
        released = {msg.request_id for msg in launcher.workers["prefill-0"].received if isinstance(msg, m.ReleaseKV)}
        assert released == {r.request_id for r in reqs}  # every prefill copy freed after its adoption
        assert not list(tmp_path.iterdir())  # and every published buffer with it
        assert not fleet.state.requests and fleet.queue_length(WorkerRole.PREFILL) == 0
        assert not fleet.views["prefill-0"].prefilling  # prefilled: no longer counted as work ahead of a prompt

    run(tiny_model_dir, tmp_path, scenario)


def test_a_dead_decode_worker_is_recomputed_without_a_lost_or_repeated_token(tiny_model_dir: Path,
                                                                               tmp_path: Path) -> None:
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        reqs = [fleet.submit(p, PARAMS) for p in PROMPTS]
        results = await asyncio.gather(*(tokens_of(fleet, r) for r in reqs))
        assert fleet.views["decode-0"].state is WorkerState.FAILED
        moved = [r for r in reqs if r.recomputes]
        assert moved and all(r.decode_worker == "decode-1" for r in moved)
        for prompt, tokens in zip(PROMPTS, results, strict=True):
            assert tokens == expected_tokens(prompt, PARAMS.max_tokens)
        resumed = [msg for msg in launcher.workers["decode-1"].received if isinstance(msg, m.RunRequest)]
        assert resumed and all(msg.output_token_ids for msg in resumed)  # continued from their tokens

    run(tiny_model_dir, tmp_path, scenario, die_after={"decode-0": 5})


def test_no_worker_of_a_role_left_refuses_new_requests(tiny_model_dir: Path, tmp_path: Path) -> None:
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        launcher.workers["decode-0"].killed.set()
        while fleet.views["decode-0"].state is not WorkerState.FAILED:
            await asyncio.sleep(0.01)
        with pytest.raises(NoWorkers, match="no decode worker"):
            fleet.submit(PROMPTS[0], PARAMS)

    run(tiny_model_dir, tmp_path, scenario, decode=1, devices=("cpu:0", "cpu:1"),
        supervision=Supervision(restart=False))


def test_a_full_queue_answers_busy(tiny_model_dir: Path, tmp_path: Path) -> None:
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        with pytest.raises(FleetBusy):
            fleet.submit(PROMPTS[0], PARAMS)

    run(tiny_model_dir, tmp_path, scenario, max_queue=0)


def test_cancel_aborts_the_request_where_it_runs(tiny_model_dir: Path, tmp_path: Path) -> None:
    long = SamplingParams(max_tokens=10_000, temperature=0.0, ignore_eos=True)

    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        req = fleet.submit(PROMPTS[0], long)
        while len(req.output_token_ids) < 3:
            await asyncio.sleep(0.005)
        worker = launcher.workers[req.holder()]
        fleet.cancel(req)
        assert req.done and req.finish_reason == "abort"
        # Block the event loop while waiting: a token already in flight would make the fleet abort the copy
        # again when it arrives, so only an Abort that `cancel` itself sent can reach the worker meanwhile.
        deadline = time.monotonic() + 5.0
        while not any(isinstance(msg, m.Abort) for msg in worker.received) and time.monotonic() < deadline:
            time.sleep(0.005)
        aborted = {msg.request_id for msg in worker.received if isinstance(msg, m.Abort)}
        assert aborted == {req.request_id}

    run(tiny_model_dir, tmp_path, scenario)


def test_sessions_lists_what_a_worker_holds(tiny_model_dir: Path, tmp_path: Path) -> None:
    long = SamplingParams(max_tokens=10_000, temperature=0.0, ignore_eos=True)

    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        req = fleet.submit(PROMPTS[1], long)
        while req.holder() is None or req.holder().startswith("prefill") or len(req.output_token_ids) < 3:
            await asyncio.sleep(0.005)
        [session] = fleet.sessions(req.holder()).sessions
        assert session.id == req.request_id and session.stage == "decode"
        assert session.prompt_tokens == len(PROMPTS[1]) and session.output_tokens >= 3
        assert fleet.sessions("prefill-0").sessions == []
        with pytest.raises(NotFound, match="unknown worker 'decode-9'"):
            fleet.sessions("decode-9")
        fleet.cancel(req)

    run(tiny_model_dir, tmp_path, scenario)


def test_the_timing_breakdown_adds_up(tiny_model_dir: Path, tmp_path: Path) -> None:
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        reqs = [fleet.submit(p, PARAMS) for p in PROMPTS]
        await asyncio.gather(*(tokens_of(fleet, r) for r in reqs))
        for record in list(fleet.stats.records)[-len(reqs):]:
            assert record["queue_s"] >= 0 and record["prefill_s"] >= 0
            assert record["queue_s"] + record["prefill_s"] == pytest.approx(record["ttft_s"], abs=1e-6)
            assert record["handoff_wall_s"] > 0 and record["first_decode_s"] > 0

    run(tiny_model_dir, tmp_path, scenario)


def test_refusals_become_one_busy_event_per_interval(tiny_model_dir: Path, tmp_path: Path) -> None:
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        events: list[tuple] = []
        fleet.state.record_event = lambda kind, wid, details: events.append((kind, details))  # type: ignore[method-assign]
        for _ in range(5):
            with pytest.raises(FleetBusy):
                fleet.submit(PROMPTS[0], PARAMS)
        assert [(kind.value, details["refused"]) for kind, details in events] == [("busy", 1)]

    run(tiny_model_dir, tmp_path, scenario, max_queue=0)


def test_requests_waiting_for_a_decode_worker_count_against_the_queue(tiny_model_dir: Path, tmp_path: Path) -> None:
    endless = SamplingParams(max_tokens=100_000, temperature=0.0, ignore_eos=True)

    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        fillers = []
        for i in range(NUM_BLOCKS):  # fill the decode worker, a few at a time
            while fleet.dispatcher.waiting() >= 3:
                await asyncio.sleep(0.002)
            fillers.append(fleet.submit([i, i + 1], endless))
        while fleet.dispatcher.waiting():
            await asyncio.sleep(0.005)
        waiting = [fleet.submit([9, 9, i], PARAMS) for i in range(3)]
        while len(fleet.state.pending_handoffs) < len(waiting):  # prefilled, their KV waiting for room
            await asyncio.sleep(0.005)
        with pytest.raises(FleetBusy, match="3 requests are already waiting"):
            fleet.submit(PROMPTS[0], PARAMS)
        for req in fillers[:3]:
            fleet.cancel(req)
        await asyncio.gather(*(tokens_of(fleet, r) for r in waiting))
        fleet.submit(PROMPTS[0], PARAMS)  # room again
        for req in fillers:
            fleet.cancel(req)

    run(tiny_model_dir, tmp_path, scenario, max_queue=3, decode=1, devices=("cpu:0", "cpu:1"))
