"""Checkpoint (stand a worker down, sessions held), restore (bring it back on a device) and migrate
(decode and mixed workers live, `live_migrate.py`; a prefill worker by checkpoint + restore elsewhere +
re-route, the source resuming if anything fails), each an operation
(`operation.py`) whose progress `/fleet/operations/{id}` reports. A checkpoint that is not written within
`Supervision.checkpoint_timeout_s` is called off (its writer killed) and the worker serves on."""

import asyncio
import contextlib
import logging
import os
import signal
import time
from pathlib import Path

from fleetctl.domain import EventKind, WorkerRole, WorkerState
from fleetctl.engine.checkpoint.format import CheckpointError, checkpoint_name, mark_used, read_checkpoint, used_at
from fleetctl.engine.fleet.checkpoint_catalog import FORCE_HINT, replay_refusal, resolve_checkpoint
from fleetctl.engine.fleet.holds import Holds
from fleetctl.engine.fleet.live_migrate import LiveMigration
from fleetctl.engine.fleet.operation import (
    LIVE,
    SHUTDOWN_TIMEOUT_S,
    Operation,
    OperationError,
    OperationRunner,
    OpKind,
)
from fleetctl.engine.fleet.worker_link import WorkerLink
from fleetctl.engine.paths import checkpoint_root
from fleetctl.engine.worker import protocol as m

DEFAULT_HOLD_S = 300.0
log = logging.getLogger(__name__)


class CheckpointOperations:
    def __init__(self, runner: OperationRunner, live: LiveMigration) -> None:
        self.runner = runner
        self.live = live
        self.state = runner.state
        self.host = runner.host
        self.holds = Holds(self.state, self._hold_expired, self._restoring)

    # ---- starting operations (validation happens here: 4xx before any change) --------------------

    def checkpoint(self, worker_id: str, hold_s: float = DEFAULT_HOLD_S) -> Operation:
        self.runner.running_worker(worker_id)
        if hold_s < 0:
            raise OperationError(400, "hold must be >= 0 seconds")
        op = Operation(OpKind.CHECKPOINT, worker_id)
        return self.runner.launch(op, self._checkpoint(op, hold_s))

    def migrate(self, worker_id: str, to: str, via_checkpoint: bool = False) -> Operation:
        """Live for decode and mixed workers, unless `via_checkpoint` (the disk path: source paused,
        checkpoint written and restored on the standby); a prefill worker always through a checkpoint."""
        view = self.runner.running_worker(worker_id)
        self.runner.check_device(to, exclude=None)
        if to == view.device:
            raise OperationError(400, f"{worker_id} already runs on {to}")
        op = Operation(OpKind.MIGRATE, worker_id, device=to)
        if via_checkpoint or view.role is WorkerRole.PREFILL:  # a prefill worker's sessions wait for their handoff
            return self.runner.launch(op, self._migrate(op, to))
        return self.runner.launch(op, self.live.migrate(op, to))

    async def restore(self, checkpoint: str, device: str, force: bool = False) -> Operation:
        """Verify the checkpoint (every file hashed, in a thread), refuse a replay unless `force`, start."""
        path = resolve_checkpoint(checkpoint)
        try:
            saved = await asyncio.to_thread(read_checkpoint, path)
        except CheckpointError as exc:
            raise OperationError(422, str(exc)) from None
        view = self.state.views.get(saved.worker_id)
        if view is not None and view.state in LIVE:
            raise OperationError(409, f"{saved.worker_id} is running; stop or checkpoint it before restoring")
        if self.runner.busy_with(saved.worker_id):
            raise OperationError(409, f"another operation is running on {saved.worker_id}")
        self.runner.check_device(device, exclude=saved.worker_id)
        refusal = replay_refusal(saved, used_at(path), self.holds.stood_down_with(saved.worker_id), self.state)
        if refusal and not force:
            raise OperationError(409, f"{refusal}; {FORCE_HINT}")
        op = Operation(OpKind.RESTORE, saved.worker_id, device=device)
        return self.runner.launch(op, self._restore(op, saved.role, path, device))

    def stop(self) -> None:
        self.holds.stop()

    # ---- messages --------------------------------------------------------------------------------

    def on_worker_message(self, worker_id: str, msg: object) -> None:
        """Checkpoint progress from a current worker."""
        op = self.runner.busy_with(worker_id)
        if isinstance(msg, m.CheckpointStarted):
            if op:
                op.writer_pid, op.stage = msg.writer_pid, "writing"
            return
        if isinstance(msg, m.CheckpointDone) and op is not None and op.kind is OpKind.CHECKPOINT:
            self.state.views[worker_id].state = WorkerState.CHECKPOINTED  # now: its exit follows, not a failure
        self.runner.resolve(worker_id, "checkpoint", msg)

    def on_progress(self, worker_id: str) -> None:
        """The worker served its sessions again: tokens, or (prefill) a re-published handoff."""
        self.runner.resolve(worker_id, "first-token", time.time())

    def on_restore_message(self, link: WorkerLink, msg: m.Restored | m.RestoreFailed) -> None:
        """From a standby process started for a restore or a migration. It takes over its worker id right
        here, on Restored: its very next message may already carry tokens."""
        if isinstance(msg, m.Restored) and link.ready is not None:
            self.runner.expect(link.worker_id, "first-token")
            self.host.take_over(link.worker_id, link, link.ready)
        self.runner.resolve(link, "restored", msg)

    # ---- the operations ------------------------------------------------------------------------

    async def _save(self, op: Operation, after: m.CheckpointAfter) -> m.CheckpointDone:
        worker_id = op.worker_id
        view = self.state.views[worker_id]
        view.state = WorkerState.DRAINING  # routes nothing new to it
        # requests for its role may wait while it pauses (until the operation ends): it comes back, held for a
        # restore or running again if the checkpoint fails; it may be the last worker of its role
        self.state.arriving[op.id] = view.role
        name = checkpoint_name(worker_id, checkpoint_root())
        timeout = self.state.config.supervision.checkpoint_timeout_s
        waiting = self.runner.wait(worker_id, "checkpoint", timeout)
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
            raise RuntimeError(f"checkpoint of {worker_id} failed: {result.reason}")
        return result

    async def _checkpoint(self, op: Operation, hold_s: float) -> dict:
        worker_id = op.worker_id
        op.stage = "pausing"
        done = await self._save(op, m.CheckpointAfter.STAND_DOWN)
        self.state.views[worker_id].state = WorkerState.CHECKPOINTED
        self.holds.hold(worker_id, hold_s, Path(done.path))
        self.state.record_event(EventKind.CHECKPOINT, worker_id, {"checkpoint": done.path, "sessions": done.sessions,
                                                                   "bytes": done.nbytes, "hold_s": hold_s})
        return {"worker": worker_id, "checkpoint": done.path, "sessions": done.sessions, "bytes": done.nbytes,
                "seconds": round(done.seconds, 4)}

    def _restoring(self, worker_id: str) -> bool:
        op = self.runner.busy_with(worker_id)
        return op is not None and op.kind is OpKind.RESTORE

    def _hold_expired(self, worker_id: str) -> None:
        self.host.recompute_held(worker_id)
        self.host.routing_changed()

    async def _restore_into(self, op: Operation, link: WorkerLink, path: Path) -> m.Restored:
        """Load `path` into the standby process; it takes over `link.worker_id` when it has (see
        on_restore_message)."""
        op.stage = "restoring"
        waiting = self.runner.wait(link, "restored")
        link.send(m.Restore(str(path)))
        try:
            outcome = await waiting
        except TimeoutError:
            outcome = m.RestoreFailed("timed out")
        if isinstance(outcome, m.RestoreFailed):
            link.kill()
            raise RuntimeError(f"restore of {link.worker_id} from {path.name} failed: {outcome.reason}")
        try:
            await asyncio.to_thread(mark_used, path, op.kind.value)
        except OSError as exc:  # the worker is restored either way; a later restore may not be refused
            log.warning("could not mark %s used: %s", path.name, exc)
        return outcome

    async def _restore(self, op: Operation, role: WorkerRole, path: Path, device: str) -> dict:
        worker_id = op.worker_id
        start = time.time()
        source = self.state.views[worker_id].device if worker_id in self.state.views else None
        try:
            link = await self.runner.start_process(op, role, device, "starting destination")
            restored = await self._restore_into(op, link, path)
        except BaseException:
            self.holds.restore_failed(worker_id)  # the held sessions must not wait without a timer
            raise
        self.holds.restored(worker_id)
        first = await self._first_token(op, restored, start)
        self.state.record_event(EventKind.RESTORE, worker_id, {"checkpoint": str(path), "device": device,
                                                                "mode": restored.mode, "reason": restored.reason})
        return self._result(worker_id, source, device, restored, str(path), first - start)

    async def _migrate(self, op: Operation, to: str) -> dict:
        worker_id = op.worker_id
        source_link, source_device = self.state.links[worker_id], self.state.views[worker_id].device
        # the destination loads the model before the source pauses: downtime excludes process start-up
        try:
            link = await self.runner.start_process(op, self.state.views[worker_id].role, to, "starting destination")
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; {worker_id} was not paused and keeps serving on {source_device}, "
                               f"nothing was lost") from None
        op.stage = "pausing source"
        try:
            done = await self._save(op, m.CheckpointAfter.HOLD)
        except RuntimeError as exc:
            await self.runner.shut_down(link)  # the standby is not needed: reaped, not left running
            raise RuntimeError(f"{exc}; the source resumed on {source_device}, nothing was lost") from None
        try:
            restored = await self._restore_into(op, link, Path(done.path))
        except RuntimeError as exc:
            self.state.views[worker_id].state = WorkerState.RUNNING
            source_link.send(m.Resume())
            self.host.routing_changed()
            raise RuntimeError(f"{exc}; the source resumed on {source_device}, nothing was lost") from None
        source_link.send(m.Shutdown())
        first = await self._first_token(op, restored, done.paused_at)
        self.state.stats.migrations.labels(mode=restored.mode).inc()
        self.state.record_event(EventKind.MIGRATE, worker_id, {"from": source_device, "to": to,
                                                                "mode": restored.mode, "reason": restored.reason})
        result = self._result(worker_id, source_device, to, restored, done.path, first - done.paused_at)
        await asyncio.to_thread(source_link.join, SHUTDOWN_TIMEOUT_S)  # reap the source process
        return {**result, "checkpoint_s": round(done.seconds, 4)}

    async def _first_token(self, op: Operation, restored: m.Restored, since: float) -> float:
        """When the restored worker produced its first token (now, if it holds no live session)."""
        op.stage = "first step"
        future = self.runner.pending(op.worker_id, "first-token")
        try:
            if not restored.sessions or future is None:
                return time.time()
            return await asyncio.wait_for(future, 120.0)
        except TimeoutError:
            return time.time()
        finally:
            self.runner.resolve(op.worker_id, "first-token", None)  # no longer waited for

    @staticmethod
    def _result(worker_id: str, source: str | None, to: str, restored: m.Restored, path: str,
                downtime: float) -> dict:
        return {"worker": worker_id, "from": source, "to": to, "mode": restored.mode, "reason": restored.reason,
                "sessions": restored.sessions, "bytes": restored.nbytes, "downtime_s": round(downtime, 4),
                "checkpoint": path, "restore_s": round(restored.seconds, 4)}
