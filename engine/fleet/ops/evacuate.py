"""Evacuating a worker: moving every session off it live (`session_move`), for a migration (to its
standby) and for `drain --move` (to its peers): each decoding session's move starts at once (their copies then go
one session at a time per source: `SessionMoves`); one not decoding yet (a
prompt still prefilling on a mixed worker, a handoff still being adopted) is moved once it decodes, and one
whose move was called off (it decodes on where it was) is tried again."""

import asyncio
import time
from collections.abc import Callable

from fleetctl.engine.api.operation_results import MoveResult
from fleetctl.engine.fleet.errors import MoveFailed
from fleetctl.engine.fleet.ops.session_move import SessionMoves, movable_from
from fleetctl.engine.fleet.request import TrackedRequest

POLL_S = 0.02
RETRY_AFTER_S = 0.5  # a session whose move was called off is tried again after this
EVACUATE_TIMEOUT_S = 300.0


async def evacuate(moves: SessionMoves, source: str, pick: Callable[[TrackedRequest], str | None],
                   progress: Callable[[str], None], called_off: Callable[[], str | None] = lambda: None,
                   timeout_s: float = EVACUATE_TIMEOUT_S, settle: bool = False) -> list[MoveResult]:
    """Move the sessions `source` holds to the workers `pick` names (None: not now) until it holds none —
    or, `settle`, until no move is under way and none of them can move now (the rest stay where they are: a
    switch between roles that decode keeps them); returns each move's result; `progress` is told how many
    moved and how many are left. Raises MoveFailed when `called_off` gives a reason or `timeout_s` passes,
    once the moves under way have ended (what moved stays moved)."""
    state = moves.state
    view = state.views[source]
    moved: list[MoveResult] = []
    tasks: dict[str, asyncio.Task] = {}
    failed_at: dict[str, float] = {}
    last_error = ""
    deadline = time.monotonic() + timeout_s
    while view.requests or tasks:
        for rid, task in [(rid, task) for rid, task in tasks.items() if task.done()]:
            del tasks[rid]
            if task.exception() is None:
                moved.append(task.result())
            else:
                last_error, failed_at[rid] = str(task.exception()), time.monotonic()
        reason = called_off() or ("" if time.monotonic() < deadline else
                                  f"{len(view.requests)} session(s) still on {source} after {timeout_s:g} s "
                                  f"(last refusal: {last_error or 'none'})")
        if reason:
            await asyncio.gather(*tasks.values(), return_exceptions=True)
            raise MoveFailed(reason)
        for rid in sorted(view.requests - tasks.keys() - moves.in_flight.by_request.keys()):
            if rid in failed_at and (settle or time.monotonic() - failed_at[rid] < RETRY_AFTER_S):
                continue
            req = state.requests.get(rid)
            dest = pick(req) if req is not None and movable_from(req) == source else None
            if req is not None and dest is not None:
                tasks[rid] = asyncio.create_task(moves.move_session(req, source, dest))
        if settle and not tasks and not moves.in_flight.by_request.keys() & view.requests:
            return moved
        progress(f"{len(moved)} moved, {len(view.requests)} left")
        await asyncio.sleep(POLL_S)
    return moved
