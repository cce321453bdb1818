"""Worker migrate, live (decode and mixed workers): a standby is started on the target device under a
temporary id (`<worker>-next`, routed to like any worker of the role once loaded), the source takes no new
work, every session it holds moves to the standby live (`evacuate`), and the standby takes over the
worker id (`Rename`); the source exits. A prefill worker holds no decoding session (its sessions wait for
their handoff), so it migrates through a checkpoint (`migrate.py`).

If the standby fails to start nothing has changed. If a move cannot complete (the standby died, or
refuses sessions until the timeout), the migration is called off: the source takes work again, the
sessions on the standby move back (or are recomputed on the source from their tokens) and the standby
is shut down."""

import time

from fleetctl.domain import EventKind, WorkerState
from fleetctl.engine.api.operation_results import LiveMigrateResult, SessionMoved
from fleetctl.engine.api.stages import LiveMigrateStage
from fleetctl.engine.fleet import placement
from fleetctl.engine.fleet.errors import MoveFailed, OperationFailed
from fleetctl.engine.fleet.ops.evacuate import evacuate
from fleetctl.engine.fleet.ops.record import Operation
from fleetctl.engine.fleet.ops.runner import OperationRunner
from fleetctl.engine.fleet.ops.session_move import SessionMoves
from fleetctl.engine.worker import protocol as m

CALL_OFF_TIMEOUT_S = 60.0


class LiveMigration:
    def __init__(self, runner: OperationRunner, moves: SessionMoves) -> None:
        self.runner = runner
        self.state = runner.state
        self.host = runner.host
        self.moves = moves

    async def migrate(self, op: Operation, to: str) -> LiveMigrateResult:
        wid = op.worker_id
        source = self.state.views[wid]
        source_link, source_device = self.state.links[wid], source.device
        standby_id = f"{wid}-next"
        try:
            link = await self.runner.start_process(op, source.role, to, LiveMigrateStage.STARTING_DESTINATION,
                                                   standby_id)
        except OperationFailed as exc:
            raise OperationFailed(f"{exc}; {wid} keeps serving on {source_device}, nothing was lost") from None
        self.runner.hold(standby_id, op)
        try:
            self.host.take_over(standby_id, link, link.ready)
            source.state = WorkerState.DRAINING  # nothing new: its sessions leave, none arrive
            self.host.routing_changed()
            started = time.time()
            standby = self.state.views[standby_id]
            try:
                moved = await evacuate(self.moves, wid, lambda req: standby_id,
                                       lambda detail: op.at(LiveMigrateStage.MOVING_SESSIONS, detail),
                                       lambda: f"the destination {standby.state.value}" if standby.gone else None)
            except MoveFailed as exc:
                await self._call_off(op, wid, standby_id)
                raise OperationFailed(f"migration of {wid} to {to} called off: {exc}; {wid} serves on "
                                   f"{source_device}, nothing was lost") from None
            op.at(LiveMigrateStage.SWITCHING_OVER)
            self._take_id(wid, standby_id)
        finally:
            self.runner.unhold(standby_id, op)
        await self.runner.shut_down(source_link)
        downtimes = [mv.downtime_s for mv in moved if mv.downtime_s is not None]
        result = LiveMigrateResult(
            worker=wid, from_=source_device, to=to, sessions=len(moved), bytes=sum(mv.bytes for mv in moved),
            downtime_s=max(downtimes, default=0.0), seconds=round(time.time() - started, 4),
            moves=[SessionMoved(request=mv.request, downtime_s=mv.downtime_s, resumed_at=mv.resumed_at)
                   for mv in moved])
        self.state.stats.migrations.labels(mode="live").inc()
        details = result.model_dump(exclude={"kind", "worker", "moves"})
        self.state.record_event(EventKind.MIGRATE, wid, details)
        return result

    def _take_id(self, wid: str, standby_id: str) -> None:
        """The standby becomes `wid`: its link, spec and view, and the sessions it holds."""
        state = self.state
        if state.recorder:  # the store knows the standby under its temporary id until now
            state.recorder.worker_stopped(state.views[standby_id], WorkerState.STOPPED, {"took_over": wid})
        link, view = state.rename_worker(standby_id, wid)
        placement.rename(list(state.requests.values()), standby_id, wid)
        link.send(m.Rename(wid))
        if state.recorder:
            state.recorder.worker_started(view)

    async def _call_off(self, op: Operation, wid: str, standby_id: str) -> None:
        """The source serves again; what reached the standby comes back, then the standby goes."""
        state = self.state
        source, standby = state.views[wid], state.views[standby_id]
        source.state = WorkerState.RUNNING
        self.host.routing_changed()
        op.at(LiveMigrateStage.CALLING_OFF, "moving sessions back")
        if not standby.gone:
            try:
                await evacuate(self.moves, standby_id, lambda req: wid, lambda detail: None,
                               lambda: "the standby is gone" if standby.gone else None, CALL_OFF_TIMEOUT_S)
            except MoveFailed:
                standby.state = WorkerState.STOPPED
                self.host.recompute_held(standby_id, kv_kept=False)
            standby.state = WorkerState.STOPPED
            await self.runner.shut_down(state.links[standby_id])
            if state.recorder:
                state.recorder.worker_stopped(standby, standby.state, {"migration_called_off": op.id})
        state.forget_worker(standby_id)
        self.host.routing_changed()
