"""Pool changes, each an operation (`runner.py`): start a worker of a role on a free device, drain one
(it takes no new prompt or handoff, and the operation ends when it holds no session), resume a drained
one, and stop one — drained first, or with `force` its sessions recomputed on its peers at once — its
process shut down and reaped.

A draining worker keeps serving what it holds. A drain (or the drain inside a stop) can be called off by
`resume`; nothing else may act on a worker while an operation runs on it."""

import asyncio
import contextlib
import time
from enum import StrEnum

from fleetctl.domain import PHASES, EventKind, WorkerRole, WorkerState
from fleetctl.engine.api.operation_results import DrainResult, MoveResult, ResumeResult, StartResult, StopResult
from fleetctl.engine.api.operations import OpKind
from fleetctl.engine.api.stages import DrainStage, StartStage, StopStage
from fleetctl.engine.core.block_allocator import blocks_for
from fleetctl.engine.fleet.errors import MoveFailed, OperationCancelled, OperationFailed, OperationRefused
from fleetctl.engine.fleet.ops.evacuate import evacuate
from fleetctl.engine.fleet.ops.record import Operation
from fleetctl.engine.fleet.ops.runner import OperationRunner
from fleetctl.engine.fleet.ops.session_move import RESERVE_SLACK_TOKENS, SessionMoves
from fleetctl.engine.fleet.request import TrackedRequest
from fleetctl.engine.fleet.worker_view import WorkerView

DRAIN_POLL_S = 0.05


class WorkerLifecycle:
    def __init__(self, runner: OperationRunner, moves: SessionMoves) -> None:
        self.runner = runner
        self.moves = moves
        self.state = runner.state
        self.host = runner.host
        self._draining: dict[str, bool] = {}  # id of an operation waiting for a drain -> called off by resume

    # ---- starting operations (validation happens here, synchronously: 4xx before any change) ----

    def start(self, role: str, device: str) -> Operation:
        worker_role = self.fleet_role(role)
        self.runner.check_device(device, exclude=None)
        op = Operation(OpKind.START, self.next_id(worker_role), device=device)
        return self.runner.launch(op, self._start(op, worker_role, device))

    def drain(self, worker_id: str, move: bool = False) -> Operation:
        """`move`: its decoding sessions move live to its peers rather than finish where they are."""
        view = self.runner.running_worker(worker_id)
        self.check_not_last(view, "drain")
        if move and not view.role.covers(WorkerRole.DECODE):
            raise OperationRefused(409, f"{worker_id} is a prefill worker: its sessions do not decode there, so "
                                        f"none moves; drain it without --move")
        op = Operation(OpKind.DRAIN, worker_id)
        self.begin_drain(view, op)
        return self.runner.launch(op, self._drain(op, view, len(view.requests), move))

    def begin_drain(self, view: WorkerView, op: Operation) -> None:
        """`view` is routed nothing new from here on, and `resume` calls `op`'s wait for it to empty off."""
        view.state = WorkerState.DRAINING
        self._draining[op.id] = False

    def resume(self, worker_id: str) -> Operation:
        view = self.runner.known_worker(worker_id)
        busy = self.runner.busy_with(worker_id)
        if busy is not None and busy.id not in self._draining:
            raise OperationRefused(409, f"another operation is running on {worker_id} ({busy.kind.value} {busy.id})")
        if view.state is not WorkerState.DRAINING:
            raise OperationRefused(409, f"{worker_id} is {view.state.value}, not draining")
        if busy is not None:
            self._draining[busy.id] = True
        view.state = WorkerState.RUNNING
        self.host.routing_changed()
        op = Operation(OpKind.RESUME, worker_id)
        return self.runner.launch(op, self._resume(op, busy))

    def stop(self, worker_id: str, force: bool = False) -> Operation:
        view = self.runner.idle_worker(worker_id)
        if view.state not in (WorkerState.RUNNING, WorkerState.DRAINING):
            raise OperationRefused(409, f"{worker_id} is {view.state.value}, not running")
        if view.state is WorkerState.RUNNING:
            self.check_not_last(view, "stop")
        view.state = WorkerState.DRAINING
        op = Operation(OpKind.STOP, worker_id)
        if not force:
            self._draining[op.id] = False
        return self.runner.launch(op, self._stop(op, view, len(view.requests), force))

    def fleet_role(self, role: str) -> WorkerRole:
        try:
            worker_role = WorkerRole(role)
        except ValueError:
            roles = ", ".join(r.value for r in WorkerRole)
            raise OperationRefused(400, f"unknown role {role!r}: use {roles}") from None
        return worker_role

    def next_id(self, role: WorkerRole) -> str:
        """The lowest `<role>-N` no worker of this fleet has had and no running operation is starting."""
        n = 0
        while (f"{role.value}-{n}" in self.state.views or f"{role.value}-{n}" in self.state.retired_ids
               or self.runner.busy_with(f"{role.value}-{n}")):
            n += 1
        return f"{role.value}-{n}"

    def check_not_last(self, view: WorkerView, verb: str, becoming: WorkerRole | None = None) -> None:
        """Refuse to take the last running worker of a phase out of service (the last to take prompts, or to
        decode: a mixed worker does both): the fleet needs every phase — unless the worker comes back
        `becoming` a role that does it (a switch: requests wait for it meanwhile)."""
        for phase in PHASES:
            if view.role.covers(phase) and not (becoming and becoming.covers(phase)):
                self._check_phase_left(view, phase, verb)

    def _check_phase_left(self, view: WorkerView, phase: WorkerRole, verb: str) -> None:
        peers = [v for v in self.state.views.values() if v.role.covers(phase) and v.worker_id != view.worker_id]
        if any(v.state is WorkerState.RUNNING for v in peers):
            return
        who = self.state.phase_workers(phase)
        in_flight = sum(1 for r in self.state.requests.values() if not r.done)
        why = (f"{in_flight} request(s) are in flight" if in_flight
               else f"the fleet would be left without a {who} worker")
        resumable = [v.worker_id for v in peers if self._resumable(v)]
        fix = f"resume {resumable[0]}" if resumable else f"start another {who} worker"
        raise OperationRefused(409, f"cannot {verb} {view.worker_id}: it is the last running {who} worker "
                                    f"and {why}; {fix} first")

    def _resumable(self, view: WorkerView) -> bool:
        """Draining, drained, or draining inside a stop: what `resume` accepts."""
        busy = self.runner.busy_with(view.worker_id)
        return view.state is WorkerState.DRAINING and (busy is None or busy.id in self._draining)

    # ---- the operations ------------------------------------------------------------------------

    async def _start(self, op: Operation, role: WorkerRole, device: str) -> StartResult:
        started = time.time()
        link = await self.runner.start_process(op, role, device, StartStage.STARTING_PROCESS)
        self.host.take_over(op.worker_id, link, link.ready)
        seconds = round(time.time() - started, 3)
        load = round(link.ready.load_seconds, 3) if link.ready else None
        return StartResult(worker=op.worker_id, role=role.value, device=device, pid=link.pid, seconds=seconds,
                           load_s=load, out_of_service_s=seconds)

    async def _drain(self, op: Operation, view: WorkerView, held: int, move: bool) -> DrainResult:
        """`held`: the sessions the worker held when it stopped taking new ones."""
        started = time.time()
        moved = await self.vacate(op, view, move, DrainStage.MOVING_SESSIONS, DrainStage.DRAINING)
        result = DrainResult(worker=view.worker_id, sessions_finished=held - moved,
                             seconds=round(time.time() - started, 3), sessions_moved=moved if move else None)
        details = result.model_dump(exclude={"kind", "worker"})
        self.state.record_event(EventKind.DRAIN, view.worker_id, details)
        return result

    async def vacate(self, op: Operation, view: WorkerView, move: bool, moving: StrEnum, draining: StrEnum,
                     hold: bool = False) -> int:
        """Wait until the draining `view` (`begin_drain`) holds no session, its decoding sessions first moved
        live to its peers when `move` (at stage `moving`; what cannot move finishes in place, at `draining`,
        or with `hold` stays where it is: a switch between roles that decode keeps it). Returns how many
        moved; raises OperationCancelled when a resume calls it off."""
        moved: list[MoveResult] = []
        if move:
            # called off by a resume (raised below), or timed out: what did not move finishes where it is
            with contextlib.suppress(MoveFailed):
                moved = await evacuate(self.moves, view.worker_id, lambda req: self._peer_for(req, view),
                                       lambda detail: op.at(moving, detail),
                                       lambda: "resumed" if self._draining[op.id] else None, settle=hold)
        if hold:
            self._stop_waiting(op, view)
        else:
            await self._drain_sessions(op, view, draining)
        return len(moved)

    def _stop_waiting(self, op: Operation, view: WorkerView) -> None:
        """`op` waits no longer for `view` to empty; raises OperationCancelled if a resume called it off."""
        if self._draining.pop(op.id):
            raise OperationCancelled(f"{view.worker_id} was resumed holding {len(view.requests)} session(s)")

    def _peer_for(self, req: TrackedRequest, view: WorkerView) -> str | None:
        """The running peer that decodes (a decode or mixed worker) with room for `req`, holding the fewest
        sessions."""
        tokens = len(req.prompt_token_ids) + len(req.output_token_ids) + RESERVE_SLACK_TOKENS
        peers = [v for v in self.state.views.values() if v.role.covers(WorkerRole.DECODE) and v.accepting
                 and v.kv.available >= blocks_for(tokens, v.kv.block_size)]
        best = min(peers, key=lambda v: (len(v.requests), -v.kv.available, v.worker_id), default=None)
        return best.worker_id if best else None

    async def _resume(self, op: Operation, called_off: Operation | None) -> ResumeResult:
        cancelled = called_off.id if called_off else None
        self.state.record_event(EventKind.RESUME, op.worker_id, {"cancelled_operation": cancelled})
        return ResumeResult(worker=op.worker_id, cancelled_operation=cancelled)

    async def _stop(self, op: Operation, view: WorkerView, held: int, force: bool) -> StopResult:
        started = time.time()
        if force:
            if view.state is not WorkerState.DRAINING:
                raise OperationFailed(f"{view.worker_id} {view.state.value} before it could be stopped")
            finished, moved = held - len(view.requests), len(view.requests)
            op.at(StopStage.RECOMPUTING, f"{moved} session(s)")
            view.state = WorkerState.STOPPED
            # it removes the KV it published as it exits: its pending handoffs are recomputed too
            self.host.recompute_held(view.worker_id, kv_kept=False)
        else:
            await self._drain_sessions(op, view, StopStage.DRAINING)
            finished, moved = held, 0
            view.state = WorkerState.STOPPED
        op.at(StopStage.STOPPING)
        await self.runner.shut_down(self.state.links[view.worker_id])
        seconds = round(time.time() - started, 3)  # it took no new work from the call on
        if self.state.recorder:
            self.state.recorder.worker_stopped(view, WorkerState.STOPPED, {
                "sessions_finished": finished, "sessions_moved": moved, "force": force, "out_of_service_s": seconds})
        return StopResult(worker=view.worker_id, sessions_finished=finished, sessions_moved=moved, seconds=seconds,
                          out_of_service_s=seconds)

    async def _drain_sessions(self, op: Operation, view: WorkerView, stage: StrEnum) -> None:
        """Wait until the (draining) worker holds no session. Raises OperationCancelled when a resume
        calls the drain off (the operation's id was entered in `_draining` when it was accepted)."""
        try:
            while True:
                if self._draining[op.id]:
                    raise OperationCancelled(f"{view.worker_id} was resumed with {len(view.requests)} "
                                             f"session(s) left to drain")
                if view.state is not WorkerState.DRAINING:
                    raise OperationFailed(f"{view.worker_id} {view.state.value} while draining; its sessions were "
                                       f"recomputed on peers")
                if not view.requests:
                    return
                op.at(stage, f"{len(view.requests)} session(s) left")
                await asyncio.sleep(DRAIN_POLL_S)
        finally:
            del self._draining[op.id]
