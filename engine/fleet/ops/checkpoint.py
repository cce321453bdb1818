"""`checkpoint`: stand a worker down with its complete state written to disk, its sessions held (their
streams open) until a restore brings it back or the hold runs out (`checkpoint_holds.py`). Also the save a migration
through a checkpoint makes (`migrate.py`), which leaves the source paused rather than gone. A checkpoint
that is not written within `Supervision.checkpoint_timeout_s` is called off (its writer killed) and the
worker serves on."""

import contextlib
import os
import signal
from pathlib import Path

from fleetctl.domain import EventKind, WorkerState
from fleetctl.engine.api.operation_results import CheckpointResult
from fleetctl.engine.api.operations import OpKind
from fleetctl.engine.api.stages import CheckpointMigrateStage, CheckpointStage
from fleetctl.engine.checkpoint.format import checkpoint_name
from fleetctl.engine.fleet.errors import OperationFailed, OperationRefused
from fleetctl.engine.fleet.ops.checkpoint_holds import Holds
from fleetctl.engine.fleet.ops.record import Operation
from fleetctl.engine.fleet.ops.runner import Awaited, OperationRunner
from fleetctl.engine.paths import checkpoint_root
from fleetctl.engine.worker import protocol as m


class Checkpoints:
    def __init__(self, runner: OperationRunner) -> None:
        self.runner = runner
        self.state = runner.state
        self.host = runner.host
        self.holds = Holds(self.state, self._hold_expired, self._restoring)

    def checkpoint(self, worker_id: str, hold_s: float | None = None) -> Operation:
        """Validated here (4xx before any change), then run as an operation; `hold_s` None: the fleet's own
        (`Supervision.hold_s`)."""
        self.runner.running_worker(worker_id)
        if hold_s is None:
            hold_s = self.state.config.supervision.hold_s
        if hold_s < 0:
            raise OperationRefused(400, "hold must be >= 0 seconds")
        op = Operation(OpKind.CHECKPOINT, worker_id)
        return self.runner.launch(op, self._checkpoint(op, hold_s))

    def stop(self) -> None:
        self.holds.stop()

    def on_worker_message(self, worker_id: str, msg: m.CheckpointStarted | m.CheckpointDone | m.CheckpointFailed
                          ) -> None:
        """Checkpoint progress from a current worker."""
        op = self.runner.busy_with(worker_id)
        if isinstance(msg, m.CheckpointStarted):
            if op:
                op.writer_pid = msg.writer_pid
                op.at(CheckpointStage.WRITING if op.kind is OpKind.CHECKPOINT else CheckpointMigrateStage.WRITING)
            return
        if isinstance(msg, m.CheckpointDone) and op is not None and op.kind is OpKind.CHECKPOINT:
            self.state.views[worker_id].state = WorkerState.CHECKPOINTED  # now: its exit follows, not a failure
        self.runner.resolve(worker_id, Awaited.CHECKPOINT, msg)

    async def save(self, op: Operation, after: m.CheckpointAfter) -> m.CheckpointDone:
        """Pause `op`'s worker and write its checkpoint; `after`: whether it then stands down or stays
        paused (a migration). Raises OperationFailed (the worker serving on) if it is not written."""
        worker_id = op.worker_id
        view = self.state.views[worker_id]
        view.state = WorkerState.DRAINING  # routes nothing new to it
        # requests for its role may wait while it pauses (until the operation ends): it comes back, held for a
        # restore or running again if the checkpoint fails; it may be the last worker of its role
        self.runner.bringing(op, view.role)
        name = checkpoint_name(worker_id, checkpoint_root())
        timeout = self.state.config.supervision.checkpoint_timeout_s
        waiting = self.runner.wait(worker_id, Awaited.CHECKPOINT, timeout)
        self.state.send(worker_id, m.TakeCheckpoint(str(checkpoint_root()), name, after))
        try:
            result = await waiting
        except TimeoutError:
            if op.writer_pid is not None:  # the worker removes what was written and serves on
                with contextlib.suppress(ProcessLookupError):
                    os.kill(op.writer_pid, signal.SIGKILL)
            self.state.send(worker_id, m.Resume())  # in case it gets to the checkpoint later, paused
            result = m.CheckpointFailed(f"not written within {timeout:g} s; the writer was killed")
        if isinstance(result, m.CheckpointFailed):
            if view.state is WorkerState.DRAINING:  # not if it died meanwhile
                view.state = WorkerState.RUNNING
            self.host.routing_changed()
            raise OperationFailed(f"checkpoint of {worker_id} failed: {result.reason}")
        return result

    async def _checkpoint(self, op: Operation, hold_s: float) -> CheckpointResult:
        worker_id = op.worker_id
        op.at(CheckpointStage.PAUSING)
        done = await self.save(op, m.CheckpointAfter.STAND_DOWN)
        self.state.views[worker_id].state = WorkerState.CHECKPOINTED
        self.holds.hold(worker_id, hold_s, Path(done.path))
        self.state.record_event(EventKind.CHECKPOINT, worker_id, {"checkpoint": done.path, "sessions": done.sessions,
                                                                   "bytes": done.nbytes, "hold_s": hold_s})
        return CheckpointResult(worker=worker_id, path=done.path, checkpoint=done.path, sessions=done.sessions,
                                bytes=done.nbytes, seconds=round(done.seconds, 4))

    def _restoring(self, worker_id: str) -> bool:
        op = self.runner.busy_with(worker_id)
        return op is not None and op.kind is OpKind.RESTORE

    def _hold_expired(self, worker_id: str) -> None:
        self.host.recompute_held(worker_id)
        self.host.routing_changed()
