"""`migrate`: move a worker to another device under the same id. Decode and mixed workers move live
(`migrate_live.py`); a prefill worker (its sessions wait for their handoff, none decodes), or any worker
when asked, goes through a checkpoint: the destination loads the model first (downtime excludes process
start-up), then the source pauses, its checkpoint is written and restored on the destination, and its
sessions are re-routed there. If anything fails the source resumes and nothing is lost."""

import asyncio
from pathlib import Path

from fleetctl.domain import EventKind, WorkerRole, WorkerState
from fleetctl.engine.api.operation_results import RestoreResult
from fleetctl.engine.api.operations import OpKind
from fleetctl.engine.api.stages import CheckpointMigrateStage
from fleetctl.engine.fleet.errors import OperationFailed, OperationRefused
from fleetctl.engine.fleet.ops.checkpoint import Checkpoints
from fleetctl.engine.fleet.ops.migrate_live import LiveMigration
from fleetctl.engine.fleet.ops.record import Operation
from fleetctl.engine.fleet.ops.restore import Restores, restore_result
from fleetctl.engine.fleet.ops.runner import SHUTDOWN_TIMEOUT_S, OperationRunner
from fleetctl.engine.worker import protocol as m


class Migrations:
    def __init__(self, runner: OperationRunner, checkpoints: Checkpoints, restores: Restores,
                 live: LiveMigration) -> None:
        self.runner = runner
        self.state = runner.state
        self.host = runner.host
        self.checkpoints = checkpoints
        self.restores = restores
        self.live = live

    def migrate(self, worker_id: str, to: str, via_checkpoint: bool = False) -> Operation:
        """Live for decode and mixed workers, unless `via_checkpoint` (the disk path: source paused,
        checkpoint written and restored on the standby); a prefill worker always through a checkpoint."""
        view = self.runner.running_worker(worker_id)
        self.runner.check_device(to, exclude=None)
        if to == view.device:
            raise OperationRefused(400, f"{worker_id} already runs on {to}")
        op = Operation(OpKind.MIGRATE, worker_id, device=to)
        if via_checkpoint or view.role is WorkerRole.PREFILL:  # a prefill worker's sessions wait for their handoff
            return self.runner.launch(op, self._via_checkpoint(op, to))
        return self.runner.launch(op, self.live.migrate(op, to))

    async def _via_checkpoint(self, op: Operation, to: str) -> RestoreResult:
        worker_id = op.worker_id
        source_link, source_device = self.state.links[worker_id], self.state.views[worker_id].device
        try:
            link = await self.runner.start_process(op, self.state.views[worker_id].role, to,
                                                   CheckpointMigrateStage.STARTING_DESTINATION)
        except OperationFailed as exc:
            raise OperationFailed(f"{exc}; {worker_id} was not paused and keeps serving on {source_device}, "
                                  f"nothing was lost") from None
        op.at(CheckpointMigrateStage.PAUSING_SOURCE)
        try:
            done = await self.checkpoints.save(op, m.CheckpointAfter.HOLD)
        except OperationFailed as exc:
            await self.runner.shut_down(link)  # the standby is not needed: reaped, not left running
            raise OperationFailed(f"{exc}; the source resumed on {source_device}, nothing was lost") from None
        try:
            restored = await self.restores.load(op, link, Path(done.path), CheckpointMigrateStage.RESTORING)
        except OperationFailed as exc:
            self.state.views[worker_id].state = WorkerState.RUNNING
            source_link.send(m.Resume())
            self.host.routing_changed()
            raise OperationFailed(f"{exc}; the source resumed on {source_device}, nothing was lost") from None
        source_link.send(m.Shutdown())
        first = await self.restores.first_token(op, restored, done.paused_at, CheckpointMigrateStage.FIRST_STEP)
        self.state.stats.migrations.labels(mode=restored.mode).inc()
        self.state.record_event(EventKind.MIGRATE, worker_id, {"from": source_device, "to": to,
                                                                "mode": restored.mode, "reason": restored.reason})
        result = restore_result(op, source_device, to, restored, done.path, first - done.paused_at,
                                checkpoint_s=round(done.seconds, 4))
        await asyncio.to_thread(source_link.join, SHUTDOWN_TIMEOUT_S)  # reap the source process
        return result
