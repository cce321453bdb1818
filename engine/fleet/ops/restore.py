"""`restore`: bring a checkpointed worker back on a device (same role). The checkpoint is verified (every
file hashed) and a replay refused unless forced (`checkpoint_catalog`) before anything starts; then a
standby process loads the model, loads the checkpoint, and takes over the worker id, its held sessions
going on there. Also the load step a migration through a checkpoint shares (`migrate.py`)."""

import asyncio
import logging
import time
from enum import StrEnum
from pathlib import Path

from fleetctl.domain import EventKind, WorkerRole
from fleetctl.engine.api.operation_results import RestoreResult
from fleetctl.engine.api.operations import OpKind
from fleetctl.engine.api.stages import RestoreStage
from fleetctl.engine.checkpoint.format import CheckpointError, mark_used, read_checkpoint, used_at
from fleetctl.engine.fleet.errors import OperationFailed, OperationRefused
from fleetctl.engine.fleet.ops.checkpoint import Checkpoints
from fleetctl.engine.fleet.ops.checkpoint_catalog import FORCE_HINT, replay_refusal, resolve_checkpoint
from fleetctl.engine.fleet.ops.record import Operation
from fleetctl.engine.fleet.ops.runner import LIVE, Awaited, OperationRunner
from fleetctl.engine.fleet.worker_link import WorkerLink
from fleetctl.engine.worker import protocol as m

FIRST_TOKEN_TIMEOUT_S = 120.0
log = logging.getLogger(__name__)


class Restores:
    def __init__(self, runner: OperationRunner, checkpoints: Checkpoints) -> None:
        self.runner = runner
        self.state = runner.state
        self.host = runner.host
        self.holds = checkpoints.holds

    async def restore(self, checkpoint: str, device: str, force: bool = False) -> Operation:
        """Verify the checkpoint (every file hashed, in a thread), refuse a replay unless `force`, start."""
        path = resolve_checkpoint(checkpoint)
        try:
            saved = await asyncio.to_thread(read_checkpoint, path)
        except CheckpointError as exc:
            raise OperationRefused(422, str(exc)) from None
        view = self.state.views.get(saved.worker_id)
        if view is not None and view.state in LIVE:
            raise OperationRefused(409, f"{saved.worker_id} is running; stop or checkpoint it before restoring")
        if self.runner.busy_with(saved.worker_id):
            raise OperationRefused(409, f"another operation is running on {saved.worker_id}")
        self.runner.check_device(device, exclude=saved.worker_id)
        refusal = replay_refusal(saved, used_at(path), self.holds.stood_down_with(saved.worker_id), self.state)
        if refusal and not force:
            raise OperationRefused(409, f"{refusal}; {FORCE_HINT}")
        op = Operation(OpKind.RESTORE, saved.worker_id, device=device)
        return self.runner.launch(op, self._restore(op, saved.role, path, device))

    def on_progress(self, worker_id: str) -> None:
        """The worker served its sessions again: tokens, or (prefill) a re-published handoff."""
        self.runner.resolve(worker_id, Awaited.FIRST_TOKEN, time.time())

    def on_restore_message(self, link: WorkerLink, msg: m.Restored | m.RestoreFailed) -> None:
        """From a standby process started for a restore or a migration. It takes over its worker id right
        here, on Restored: its very next message may already carry tokens."""
        if isinstance(msg, m.Restored) and link.ready is not None:
            self.runner.expect(link.worker_id, Awaited.FIRST_TOKEN)
            self.host.take_over(link.worker_id, link, link.ready)
        self.runner.resolve(link, Awaited.RESTORED, msg)

    async def load(self, op: Operation, link: WorkerLink, path: Path, stage: StrEnum) -> m.Restored:
        """Load `path` into the standby process (`stage`: its kind's "restoring"); it takes over
        `link.worker_id` when it has (see on_restore_message). Raises OperationFailed, the standby killed."""
        op.at(stage)
        waiting = self.runner.wait(link, Awaited.RESTORED)
        link.send(m.Restore(str(path)))
        try:
            outcome = await waiting
        except TimeoutError:
            outcome = m.RestoreFailed("timed out")
        if isinstance(outcome, m.RestoreFailed):
            link.kill()
            raise OperationFailed(f"restore of {link.worker_id} from {path.name} failed: {outcome.reason}")
        try:
            await asyncio.to_thread(mark_used, path, op.kind.value)
        except OSError as exc:  # the worker is restored either way; a later restore may not be refused
            log.warning("could not mark %s used: %s", path.name, exc)
        return outcome

    async def first_token(self, op: Operation, restored: m.Restored, since: float, stage: StrEnum) -> float:
        """When the restored worker produced its first token (now, if it holds no live session)."""
        op.at(stage)
        future = self.runner.pending(op.worker_id, Awaited.FIRST_TOKEN)
        try:
            if not restored.sessions or future is None:
                return time.time()
            return await asyncio.wait_for(future, FIRST_TOKEN_TIMEOUT_S)
        except TimeoutError:
            return time.time()
        finally:
            self.runner.resolve(op.worker_id, Awaited.FIRST_TOKEN, None)  # no longer waited for

    async def _restore(self, op: Operation, role: WorkerRole, path: Path, device: str) -> RestoreResult:
        worker_id = op.worker_id
        start = time.time()
        source = self.state.views[worker_id].device if worker_id in self.state.views else None
        try:
            link = await self.runner.start_process(op, role, device, RestoreStage.STARTING_DESTINATION)
            restored = await self.load(op, link, path, RestoreStage.RESTORING)
        except BaseException:
            self.holds.restore_failed(worker_id)  # the held sessions must not wait without a timer
            raise
        self.holds.restored(worker_id)
        first = await self.first_token(op, restored, start, RestoreStage.FIRST_STEP)
        self.state.record_event(EventKind.RESTORE, worker_id, {"checkpoint": str(path), "device": device,
                                                                "mode": restored.mode, "reason": restored.reason})
        return restore_result(op, source, device, restored, str(path), first - start)


def restore_result(op: Operation, source: str | None, to: str, restored: m.Restored, path: str, downtime: float,
                   checkpoint_s: float | None = None) -> RestoreResult:
    """What `op` (a restore, or a migration through a checkpoint) returns."""
    assert op.kind in (OpKind.RESTORE, OpKind.MIGRATE)
    return RestoreResult(kind=op.kind.value, worker=op.worker_id, from_=source, to=to, mode=restored.mode,
                         reason=restored.reason, sessions=restored.sessions, bytes=restored.nbytes,
                         downtime_s=round(downtime, 4), checkpoint=path, restore_s=round(restored.seconds, 4),
                         checkpoint_s=checkpoint_s)
