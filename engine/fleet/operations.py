"""Long fleet operations: checkpoint (stand a worker down, sessions held), restore (bring it back on a
device) and migrate (checkpoint + restore elsewhere + re-route, the source resuming if anything fails).
Each runs as an asyncio task whose progress `/fleet/operations/{id}` reports."""

import asyncio
import dataclasses
import logging
import time
import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from fleetctl.engine.checkpoint.format import (
    CheckpointError,
    checkpoint_name,
    list_checkpoints,
    read_checkpoint,
)
from fleetctl.engine.core.device_names import DeviceError, check_device
from fleetctl.engine.fleet.config import pinned_cores
from fleetctl.engine.fleet.router import WorkerView
from fleetctl.engine.fleet.state import FleetState
from fleetctl.engine.fleet.worker_link import WorkerLink
from fleetctl.engine.paths import checkpoint_root
from fleetctl.engine.worker import protocol as m
from fleetctl.engine.worker.spec import WorkerSpec
from fleetctl.store.records import DeviceKind, EventKind, WorkerRole, WorkerState

log = logging.getLogger(__name__)

DEFAULT_HOLD_S = 300.0
START_TIMEOUT_S = 300.0


class OpKind(StrEnum):
    CHECKPOINT = "checkpoint"
    RESTORE = "restore"
    MIGRATE = "migrate"


class OpState(StrEnum):
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class OperationError(Exception):
    """A request for an operation that cannot start; `status` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Operation:
    kind: OpKind
    worker_id: str
    id: str = field(default_factory=lambda: f"op-{uuid.uuid4().hex[:12]}")
    state: OpState = OpState.RUNNING
    stage: str = "queued"
    started: float = field(default_factory=time.time)
    result: dict | None = None
    error: str | None = None
    writer_pid: int | None = None
    destination_pid: int | None = None

    def as_json(self) -> dict:
        return {"id": self.id, "kind": self.kind.value, "worker": self.worker_id, "state": self.state.value,
                "stage": self.stage, "started": self.started, "result": self.result, "error": self.error,
                "writer_pid": self.writer_pid, "destination_pid": self.destination_pid}


def resolve_checkpoint(given: str) -> Path:
    """A checkpoint name or path, which must lie inside $FLEET_HOME/checkpoints."""
    root = checkpoint_root().resolve()
    if ".." in Path(given).parts:
        raise OperationError(400, f"checkpoint path {given!r} may not contain '..'")
    path = (Path(given) if Path(given).is_absolute() else root / given).resolve()
    if root not in path.parents:
        raise OperationError(400, f"checkpoint {given!r} is outside {root}")
    if not path.is_dir():
        raise OperationError(404, f"no checkpoint {given!r} in {root}")
    return path


class WorkerHost(Protocol):
    """What operations need from the controller: processes it starts and links it reads."""

    def launch(self, spec: WorkerSpec) -> WorkerLink:
        """Start a worker process; its messages reach this object's on_foreign_* until it takes over."""

    def take_over(self, worker_id: str, link: WorkerLink, ready: m.WorkerReady) -> None:
        """Make `link` the process of `worker_id` (a restore, or the destination of a migration)."""

    def routing_changed(self) -> None:
        """A worker's state changed outside a message: route what was waiting."""

    def recompute_held(self, worker_id: str) -> None:
        """Continue every request `worker_id` holds on a peer of its role."""


class FleetOperations:
    def __init__(self, state: FleetState, host: WorkerHost) -> None:
        self.state = state
        self.host = host
        self.ops: dict[str, Operation] = {}
        self._busy: dict[str, str] = {}  # worker id -> running operation id
        self._waiters: dict[tuple[object, str], asyncio.Future] = {}
        self._hold_timers: dict[str, asyncio.TimerHandle] = {}

    # ---- starting operations (validation happens here, synchronously: 4xx before any change) ----

    def checkpoint(self, worker_id: str, hold_s: float = DEFAULT_HOLD_S) -> Operation:
        self._running_worker(worker_id)
        if hold_s < 0:
            raise OperationError(400, "hold must be >= 0 seconds")
        return self._launch(Operation(OpKind.CHECKPOINT, worker_id), self._checkpoint(worker_id, hold_s))

    def migrate(self, worker_id: str, to: str) -> Operation:
        view = self._running_worker(worker_id)
        self._check_device(to, exclude=None)
        if to == view.device:
            raise OperationError(400, f"{worker_id} already runs on {to}")
        return self._launch(Operation(OpKind.MIGRATE, worker_id), self._migrate(worker_id, to))

    def restore(self, checkpoint: str, device: str) -> Operation:
        path = resolve_checkpoint(checkpoint)
        try:
            saved = read_checkpoint(path)
        except CheckpointError as exc:
            raise OperationError(422, str(exc)) from None
        view = self.state.views.get(saved.worker_id)
        if view is not None and view.state in (WorkerState.RUNNING, WorkerState.STARTING, WorkerState.DRAINING):
            raise OperationError(409, f"{saved.worker_id} is running; stop or checkpoint it before restoring")
        if saved.worker_id in self._busy:
            raise OperationError(409, f"another operation is running on {saved.worker_id}")
        self._check_device(device, exclude=saved.worker_id)
        op = Operation(OpKind.RESTORE, saved.worker_id)
        return self._launch(op, self._restore(saved.worker_id, saved.role, path, device))

    def get(self, op_id: str) -> Operation:
        if op_id not in self.ops:
            raise OperationError(404, f"no operation {op_id!r}")
        return self.ops[op_id]

    def list_checkpoints(self) -> list[dict]:
        rows = []
        for path in list_checkpoints(checkpoint_root()):
            try:
                saved = read_checkpoint(path)
            except CheckpointError as exc:
                rows.append({"path": str(path), "name": path.name, "valid": False, "error": str(exc)})
                continue
            rows.append({"path": str(path), "name": path.name, "valid": True, "worker": saved.worker_id,
                         "role": saved.role.value, "sessions": len(saved.sessions), "created": saved.manifest.created,
                         "bytes": sum(f.stat().st_size for f in path.iterdir())})
        return rows

    def _running_worker(self, worker_id: str) -> WorkerView:
        view = self.state.views.get(worker_id)
        if view is None:
            raise OperationError(404, f"unknown worker {worker_id!r}")
        if worker_id in self._busy:
            raise OperationError(409, f"another operation is running on {worker_id}")
        if view.state is not WorkerState.RUNNING:
            raise OperationError(409, f"{worker_id} is {view.state.value}, not running")
        return view

    def _check_device(self, device: str, exclude: str | None) -> None:
        try:
            check_device(device, indexed=True)
        except DeviceError as exc:
            raise OperationError(400, str(exc)) from None
        for view in self.state.views.values():
            live = view.state in (WorkerState.RUNNING, WorkerState.STARTING, WorkerState.DRAINING)
            if view.device == device and live and view.worker_id != exclude:
                raise OperationError(409, f"{device} already hosts {view.worker_id}")
        if any(device == target for target in self._targets()):
            raise OperationError(409, f"{device} is the target of another operation")

    def _targets(self) -> list[str]:
        return [op.result["to"] for op in self.ops.values() if op.state is OpState.RUNNING and op.result]

    def _launch(self, op: Operation, work) -> Operation:
        self.ops[op.id] = op
        self._busy[op.worker_id] = op.id

        async def run() -> None:
            try:
                op.result = await work
                op.state, op.stage = OpState.DONE, "done"
            except (OperationError, CheckpointError, RuntimeError, TimeoutError) as exc:
                op.state, op.error = OpState.FAILED, str(exc)
            except Exception as exc:  # a bug: the operation must still end, and say why
                log.exception("operation %s failed", op.id)
                op.state, op.error = OpState.FAILED, f"internal error: {exc!r}"
            finally:
                self._busy.pop(op.worker_id, None)

        asyncio.get_running_loop().create_task(run())
        return op

    # ---- waiting on workers -------------------------------------------------------------------

    def _wait(self, key: object, event: str, timeout: float = START_TIMEOUT_S) -> "asyncio.Future":
        future = asyncio.get_running_loop().create_future()
        self._waiters[(key, event)] = future
        return asyncio.wait_for(future, timeout)

    def _resolve(self, key: object, event: str, value: object) -> None:
        future = self._waiters.pop((key, event), None)
        if future is not None and not future.done():
            future.set_result(value)

    def on_worker_message(self, worker_id: str, msg: object) -> None:
        """Checkpoint progress from a current worker."""
        if isinstance(msg, m.CheckpointStarted):
            op = self.ops.get(self._busy.get(worker_id, ""))
            if op:
                op.writer_pid, op.stage = msg.writer_pid, "writing"
        else:
            self._resolve(worker_id, "checkpoint", msg)

    def on_progress(self, worker_id: str) -> None:
        """The worker served its sessions again: tokens, or (prefill) a re-published handoff."""
        self._resolve(worker_id, "first-token", time.time())

    def on_foreign_message(self, link: WorkerLink, msg: object) -> None:
        """Messages from a standby process started for a restore or a migration. It takes over its
        worker id right here, on Restored: its very next message may already carry tokens."""
        if isinstance(msg, m.WorkerReady):
            self._resolve(link, "ready", msg)
        elif isinstance(msg, m.Restored) and link.ready is not None:
            self._waiters[(link.worker_id, "first-token")] = asyncio.get_running_loop().create_future()
            self.host.take_over(link.worker_id, link, link.ready)
            self._resolve(link, "restored", msg)
        elif isinstance(msg, m.RestoreFailed):
            self._resolve(link, "restored", msg)

    def on_foreign_exit(self, link: WorkerLink) -> None:
        gone = m.RestoreFailed(f"the new {link.worker_id} process exited")
        self._resolve(link, "ready", gone)
        self._resolve(link, "restored", gone)

    # ---- the operations ------------------------------------------------------------------------

    async def _save(self, worker_id: str, after: m.CheckpointAfter) -> m.CheckpointDone:
        self.state.views[worker_id].state = WorkerState.DRAINING  # routes nothing new to it
        name = checkpoint_name(worker_id)
        waiting = self._wait(worker_id, "checkpoint")
        self.state.send(worker_id, m.TakeCheckpoint(str(checkpoint_root()), name, after))
        result = await waiting
        if isinstance(result, m.CheckpointFailed):
            self.state.views[worker_id].state = WorkerState.RUNNING
            self.host.routing_changed()
            raise RuntimeError(f"checkpoint of {worker_id} failed: {result.reason}")
        return result

    async def _checkpoint(self, worker_id: str, hold_s: float) -> dict:
        op = self.ops[self._busy[worker_id]]
        op.stage = "pausing"
        done = await self._save(worker_id, m.CheckpointAfter.STAND_DOWN)
        view = self.state.views[worker_id]
        view.state = WorkerState.CHECKPOINTED
        self._hold_timers[worker_id] = asyncio.get_running_loop().call_later(hold_s, self._hold_expired, worker_id)
        self.state.record_event(EventKind.CHECKPOINT, worker_id, {"path": done.path, "sessions": done.sessions,
                                                                   "bytes": done.nbytes, "hold_s": hold_s})
        return {"worker": worker_id, "path": done.path, "sessions": done.sessions, "bytes": done.nbytes,
                "seconds": round(done.seconds, 4)}

    def _hold_expired(self, worker_id: str) -> None:
        self._hold_timers.pop(worker_id, None)
        view = self.state.views[worker_id]
        if view.state is WorkerState.CHECKPOINTED:
            view.state = WorkerState.STOPPED
            self.host.recompute_held(worker_id)

    async def _start_standby(self, worker_id: str, role: WorkerRole, device: str) -> WorkerLink:
        """A new process for `worker_id` on `device`, model loaded, no sessions, not yet routed to."""
        op = self.ops[self._busy[worker_id]]
        spec = self._spec_for(worker_id, role, device)
        link = self.host.launch(spec)
        op.destination_pid, op.stage = link.pid, "starting destination"
        try:
            ready = await self._wait(link, "ready")
        except TimeoutError:
            link.kill()
            raise RuntimeError(f"the new {worker_id} process on {device} did not start in time") from None
        if not isinstance(ready, m.WorkerReady):
            link.kill()
            raise RuntimeError(f"the new {worker_id} process on {device} exited during startup")
        link.ready = ready
        return link

    async def _restore_into(self, link: WorkerLink, path: Path) -> m.Restored:
        """Load `path` into the standby process; it takes over `link.worker_id` when it has (see
        on_foreign_message)."""
        self.ops[self._busy[link.worker_id]].stage = "restoring"
        waiting = self._wait(link, "restored")
        link.send(m.Restore(str(path)))
        try:
            outcome = await waiting
        except TimeoutError:
            outcome = m.RestoreFailed("timed out")
        if isinstance(outcome, m.RestoreFailed):
            link.kill()
            raise RuntimeError(f"restore of {link.worker_id} from {path.name} failed: {outcome.reason}")
        return outcome

    def _spec_for(self, worker_id: str, role: WorkerRole, device: str) -> WorkerSpec:
        """The spec `worker_id` runs with on `device`: its own, or for a worker this fleet did not start
        (another fleet's checkpoint) any worker's, with that id and role."""
        specs = self.state.specs
        base = specs[worker_id] if worker_id in specs else next(iter(specs.values()))
        cpu_devices = {v.device for v in self.state.views.values()
                       if check_device(v.device, indexed=True).kind is DeviceKind.CPU}
        return dataclasses.replace(base, worker_id=worker_id, role=role, device=device,
                                   cores=pinned_cores(device, cpu_devices))

    async def _restore(self, worker_id: str, role: WorkerRole, path: Path, device: str) -> dict:
        start = time.time()
        source = self.state.views[worker_id].device if worker_id in self.state.views else None
        link = await self._start_standby(worker_id, role, device)
        timer = self._hold_timers.pop(worker_id, None)
        if timer:
            timer.cancel()
        restored = await self._restore_into(link, path)
        first = await self._first_token(worker_id, restored, start)
        self.state.record_event(EventKind.RESTORE, worker_id, {"path": str(path), "device": device,
                                                                "mode": restored.mode, "reason": restored.reason})
        return self._result(worker_id, source, device, restored, str(path), first - start)

    async def _migrate(self, worker_id: str, to: str) -> dict:
        op = self.ops[self._busy[worker_id]]
        source_link, source_device = self.state.links[worker_id], self.state.views[worker_id].device
        op.result = {"to": to}  # reserves the target device
        # the destination loads the model before the source pauses: downtime excludes process start-up
        try:
            link = await self._start_standby(worker_id, self.state.views[worker_id].role, to)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; {worker_id} was not paused and keeps serving on {source_device}, "
                               f"nothing was lost") from None
        op.stage = "pausing source"
        try:
            done = await self._save(worker_id, m.CheckpointAfter.HOLD)
        except RuntimeError:
            link.send(m.Shutdown())
            raise
        try:
            restored = await self._restore_into(link, Path(done.path))
        except RuntimeError as exc:
            self.state.views[worker_id].state = WorkerState.RUNNING
            source_link.send(m.Resume())
            self.host.routing_changed()
            raise RuntimeError(f"{exc}; the source resumed on {source_device}, nothing was lost") from None
        source_link.send(m.Shutdown())
        first = await self._first_token(worker_id, restored, done.paused_at)
        self.state.stats.migrations.labels(mode=restored.mode).inc()
        self.state.record_event(EventKind.MIGRATE, worker_id, {"from": source_device, "to": to,
                                                                "mode": restored.mode, "reason": restored.reason})
        result = self._result(worker_id, source_device, to, restored, done.path, first - done.paused_at)
        return {**result, "checkpoint_s": round(done.seconds, 4)}

    async def _first_token(self, worker_id: str, restored: m.Restored, since: float) -> float:
        """When the restored worker produced its first token (now, if it holds no live session)."""
        op = self.ops[self._busy[worker_id]]
        op.stage = "first step"
        future = self._waiters.get((worker_id, "first-token"))
        if not restored.sessions or future is None:
            self._waiters.pop((worker_id, "first-token"), None)
            return time.time()
        try:
            return await asyncio.wait_for(future, 120.0)
        except TimeoutError:
            return time.time()
        finally:
            self._waiters.pop((worker_id, "first-token"), None)

    @staticmethod
    def _result(worker_id: str, source: str | None, to: str, restored: m.Restored, path: str,
                downtime: float) -> dict:
        return {"worker": worker_id, "from": source, "to": to, "mode": restored.mode, "reason": restored.reason,
                "sessions": restored.sessions, "bytes": restored.nbytes, "downtime_s": round(downtime, 4),
                "checkpoint": path, "restore_s": round(restored.seconds, 4)}
