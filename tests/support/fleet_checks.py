"""Checks shared by the controller's tests on fake workers: every request ends with its exact tokens or one
error, and nothing is left behind (KV blocks, shared-memory buffers, requests)."""

import asyncio
import time
from pathlib import Path

from fleetctl.domain import WorkerState
from fleetctl.engine.api.operations import OpState
from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.fleet.ops.record import Operation
from fleetctl.engine.fleet.request import StreamEvent, TrackedRequest
from support.fake_workers import NUM_BLOCKS, FakeLauncher, expected_tokens, tokens_of


def prompts(count: int, offset: int = 0) -> list[list[int]]:
    return [[3 + i + offset, 4 + i, 5 + (i + offset) % 7] for i in range(count)]


async def until(predicate, why=lambda: "timed out", timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, why()
        await asyncio.sleep(0.005)


async def finished(op: Operation) -> Operation:
    await until(lambda: op.state is not OpState.RUNNING, lambda: f"{op.kind.value} {op.id} still at {op.stage}")
    return op


async def all_complete(fleet: Fleet, reqs: list[TrackedRequest]) -> None:
    """Every request ends without an error, with exactly the tokens it would have had undisturbed."""
    results = await asyncio.gather(*(tokens_of(fleet, r) for r in reqs))
    for req, tokens in zip(reqs, results, strict=True):
        assert tokens == expected_tokens(req.prompt_token_ids, req.params.max_tokens), req.request_id


async def outcome(fleet: Fleet, req: TrackedRequest) -> list[StreamEvent]:
    """The request's events; it must end with exactly one final event."""
    events = [event async for event in fleet.stream(req)]
    assert [e.final for e in events].count(True) == 1 and events[-1].final
    return events


async def ends(fleet: Fleet, reqs: list[TrackedRequest]) -> dict[str, str | None]:
    """Every request ends with its exact tokens or one error; request id -> the error (None: completed)."""
    results = await asyncio.gather(*(outcome(fleet, r) for r in reqs))
    errors = {}
    for req, events in zip(reqs, results, strict=True):
        errors[req.request_id] = events[-1].error
        if events[-1].error is None:
            tokens = [e.token_id for e in events if e.token_id is not None]
            assert tokens == expected_tokens(req.prompt_token_ids, req.params.max_tokens), req.request_id
    return errors


async def nothing_leaked(fleet: Fleet, launcher: FakeLauncher) -> None:
    """Every live worker's blocks are free again (as it says, and as the controller sees it), no buffer
    is left in shared memory and the controller follows no request."""
    # by the id each fake answers to now (a worker that switched role took a new one)
    live = [w for w in launcher.workers.values()
            if (view := fleet.views.get(w.spec.worker_id)) is not None and view.state is WorkerState.RUNNING]
    await until(lambda: all(not w.sessions for w in live) and not list(launcher.shm_dir.iterdir()),
                lambda: f"sessions {[(w.spec.worker_id, list(w.sessions)) for w in live]}, "
                        f"buffers {list(launcher.shm_dir.iterdir())}")
    await until(lambda: all(fleet.views[w.spec.worker_id].kv.free == NUM_BLOCKS for w in live))
    assert all(fleet.views[w.spec.worker_id].kv.available == NUM_BLOCKS for w in live)  # no reservation left
    assert not fleet.state.requests and not fleet.state.queued


def shm(tmp_path: Path) -> Path:
    path = tmp_path / "shm"
    path.mkdir(exist_ok=True)
    return path
