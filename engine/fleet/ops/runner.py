"""What every kind of operation shares: running it as a task (its expected failures — FleetError,
CheckpointError, TimeoutError — end it with their message; anything else is a bug, logged with its
traceback and reported as an internal error), one operation per worker at a time, the device a new process
starts on reserved until the operation ends, waiting on worker messages (`Awaited`), and starting a worker
process (a new worker, or the standby of a restore or a migration). The kinds live beside it in `ops/`."""

import asyncio
import dataclasses
import logging
from collections.abc import Coroutine
from enum import StrEnum
from typing import Any, Protocol

from fleetctl.domain import WorkerRole, WorkerState
from fleetctl.engine.api.device_names import DeviceError, gpu_clash, memory_share
from fleetctl.engine.api.operation_results import OperationResult
from fleetctl.engine.api.operations import OpState
from fleetctl.engine.api.stages import loading_model
from fleetctl.engine.core.local_devices import check_device
from fleetctl.engine.fleet.errors import OperationCancelled, OperationFailed, OperationRefused
from fleetctl.engine.fleet.fleet_config import pinned_cores
from fleetctl.engine.fleet.ops.moves_in_flight import MovesInFlight
from fleetctl.engine.fleet.ops.record import Operation
from fleetctl.engine.fleet.state import FleetState
from fleetctl.engine.fleet.worker_link import WorkerLink
from fleetctl.engine.fleet.worker_view import WorkerView
from fleetctl.engine.worker import protocol as m
from fleetctl.engine.worker.spec import WorkerSpec
from fleetctl.errors import FleetctlError

log = logging.getLogger(__name__)

START_TIMEOUT_S = 300.0
SHUTDOWN_TIMEOUT_S = 30.0  # a worker that has not exited by then is killed
KEEP_FINISHED = 200  # finished operations kept for /fleet/operations/{id}; older ones are forgotten
LIVE = (WorkerState.RUNNING, WorkerState.STARTING, WorkerState.DRAINING)


class Awaited(StrEnum):
    """What an operation waits for from a worker process (`OperationRunner.expect` / `resolve`)."""

    READY = "ready"  # a process it started loaded the model (WorkerReady, or RestoreFailed if it exited)
    RESTORED = "restored"  # a standby loaded a checkpoint (Restored / RestoreFailed)
    CHECKPOINT = "checkpoint"  # a worker wrote its checkpoint (CheckpointDone / CheckpointFailed)
    FIRST_TOKEN = "first-token"  # a restored worker served its sessions again
    SWITCHED = "switched"  # a worker re-laid itself for another role (RoleSwitched / SwitchFailed)


class WorkerHost(Protocol):
    """What operations need from the controller: processes it starts and links it reads."""

    def check_device(self, device: str) -> None:
        """Raise DeviceError unless the fleet's launcher can place a worker on `device`."""

    def launch(self, spec: WorkerSpec) -> WorkerLink:
        """Start a worker process; its messages reach the runner's on_foreign_* until it takes over."""

    def take_over(self, worker_id: str, link: WorkerLink, ready: m.WorkerReady) -> None:
        """Make `link` the process of `worker_id` (a new worker, a restore, a migration's destination)."""

    def routing_changed(self) -> None:
        """A worker's state changed outside a message: route what was waiting."""

    def recompute_held(self, worker_id: str, kv_kept: bool = True) -> None:
        """Continue every request `worker_id` holds on a peer of its role (`kv_kept`: whether the KV it
        published to shared memory survives it)."""


class OperationRunner:
    def __init__(self, state: FleetState, host: WorkerHost, moves: MovesInFlight) -> None:
        self.state = state
        self.host = host
        self.moves = moves  # the live session moves under way: a worker they involve is not idle
        self.ops: dict[str, Operation] = {}
        self._busy: dict[str, str] = {}  # worker id -> running operation id
        self._waiters: dict[tuple[object, Awaited], asyncio.Future] = {}

    # ---- checks every kind makes before it starts (4xx, nothing changed) -------------------------

    def get(self, op_id: str) -> Operation:
        if op_id not in self.ops:
            raise OperationRefused(404, f"no operation {op_id!r}")
        return self.ops[op_id]

    def busy_with(self, worker_id: str) -> Operation | None:
        """The operation running on `worker_id`, if one is."""
        op_id = self._busy.get(worker_id)
        return self.ops[op_id] if op_id else None

    def known_worker(self, worker_id: str) -> WorkerView:
        view = self.state.views.get(worker_id)
        if view is None:
            raise OperationRefused(404, f"unknown worker {worker_id!r}")
        return view

    def idle_worker(self, worker_id: str) -> WorkerView:
        """A known worker no operation is running on."""
        view = self.known_worker(worker_id)
        busy = self.busy_with(worker_id)
        if busy is not None:
            raise OperationRefused(409, f"another operation is running on {worker_id} ({busy.kind.value} {busy.id})")
        if moving := self.moves.involving(worker_id):
            raise OperationRefused(409, f"{moving} session(s) are moving live to or from {worker_id}; try again when "
                                        f"they have moved")
        return view

    def running_worker(self, worker_id: str) -> WorkerView:
        view = self.idle_worker(worker_id)
        if view.state is not WorkerState.RUNNING:
            raise OperationRefused(409, f"{worker_id} is {view.state.value}, not running")
        return view

    def check_device(self, device: str, exclude: str | None) -> None:
        """`device` names a device of this machine that no live worker (other than `exclude`) runs on
        and no running operation is starting a process on."""
        try:
            check_device(device, indexed=True)
            self.host.check_device(device)
        except DeviceError as exc:
            raise OperationRefused(400, str(exc)) from None
        for view in self.state.views.values():
            if view.state in LIVE and view.worker_id != exclude and gpu_clash(device, [view.device]):
                where = "" if view.device == device else f" on {view.device} (the same GPU, named whole and as a slot)"
                raise OperationRefused(409, f"{device} already hosts {view.worker_id}{where}")
        for op in self.ops.values():
            if op.state is OpState.RUNNING and op.device == device:
                raise OperationRefused(409, f"{device} is the target of another operation ({op.kind.value} {op.id})")

    # ---- running -------------------------------------------------------------------------------

    def launch(self, op: Operation, work: Coroutine[Any, Any, OperationResult], exclusive: bool = True) -> Operation:
        """Run `work` as `op`; `exclusive`: no other operation may act on its worker meanwhile (a session
        move is not: several sessions may leave one worker at once)."""
        self.ops[op.id] = op
        if exclusive:
            self._busy[op.worker_id] = op.id
        self._forget_finished()

        async def run() -> None:
            try:
                op.result = await work
                op.state, op.step, op.stage = OpState.DONE, "done", "done"
            except OperationCancelled as exc:
                op.state, op.error = OpState.CANCELLED, str(exc)
            except (FleetctlError, TimeoutError) as exc:  # expected: the operation failed, and says why
                op.state, op.error = OpState.FAILED, str(exc)
            except Exception as exc:  # a bug (a RuntimeError included): the operation still ends, and says why
                log.exception("operation %s (%s of %s) failed", op.id, op.kind.value, op.worker_id)
                op.state, op.error = OpState.FAILED, f"internal error: {exc!r}"
            finally:
                self.state.arriving.pop(op.id, None)
                if self._busy.get(op.worker_id) == op.id:  # a resume may have taken the worker over
                    del self._busy[op.worker_id]
                self.host.routing_changed()  # what waited for the process it started (or gave up on it)

        asyncio.get_running_loop().create_task(run())
        return op

    def bringing(self, op: Operation, role: WorkerRole) -> None:
        """`op` brings a worker of `role` (a process it starts, or one it pauses for a checkpoint): requests for
        the role may wait for it until `op` ends (FleetState.serves)."""
        self.state.arriving[op.id] = role

    def hold(self, worker_id: str, op: Operation) -> None:
        """`op` acts on `worker_id` too (a migration's standby): no other operation may meanwhile."""
        self._busy[worker_id] = op.id

    def unhold(self, worker_id: str, op: Operation) -> None:
        if self._busy.get(worker_id) == op.id:
            del self._busy[worker_id]

    def _forget_finished(self) -> None:
        finished = [op_id for op_id, op in self.ops.items() if op.state is not OpState.RUNNING]
        for op_id in finished[: max(0, len(finished) - KEEP_FINISHED)]:
            del self.ops[op_id]

    def expect(self, key: object, event: Awaited) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self._waiters[(key, event)] = future
        return future

    def wait(self, key: object, event: Awaited, timeout: float = START_TIMEOUT_S) -> Coroutine[Any, Any, Any]:
        return asyncio.wait_for(self.expect(key, event), timeout)

    def pending(self, key: object, event: Awaited) -> asyncio.Future | None:
        """The future `expect` made, still resolvable (resolve removes it)."""
        return self._waiters.get((key, event))

    def resolve(self, key: object, event: Awaited, value: object) -> None:
        future = self._waiters.pop((key, event), None)
        if future is not None and not future.done():
            future.set_result(value)

    # ---- worker processes ------------------------------------------------------------------------

    def on_foreign_message(self, link: WorkerLink, msg: object) -> None:
        """Start-up messages from a process an operation started, before it takes over its id."""
        if isinstance(msg, m.WorkerLoading):
            op = self.busy_with(link.worker_id)
            stage = loading_model(op.kind) if op is not None else None
            if op is not None and stage is not None:
                op.at(stage)
        elif isinstance(msg, m.WorkerReady):
            self.resolve(link, Awaited.READY, msg)
        elif isinstance(msg, m.WorkerFailed):
            link.last_error = msg.reason

    def on_foreign_exit(self, link: WorkerLink) -> None:
        why = f": {link.last_error}" if link.last_error else ""
        gone = m.RestoreFailed(f"the new {link.worker_id} process exited{why}")
        self.resolve(link, Awaited.READY, gone)
        self.resolve(link, Awaited.RESTORED, gone)

    async def start_process(self, op: Operation, role: WorkerRole, device: str, stage: StrEnum,
                            worker_id: str | None = None) -> WorkerLink:
        """A new process for `op.worker_id` on `device` (with `op.worker_id`'s spec, under `worker_id` when
        given), model loaded, not yet routed to (it takes over its id when the operation says so)."""
        spec = self.spec_for(op.worker_id, role, device)
        link = self.host.launch(dataclasses.replace(spec, worker_id=worker_id or op.worker_id))
        op.destination_pid = link.pid
        op.at(stage)
        self.bringing(op, role)
        try:
            ready = await self.wait(link, Awaited.READY)
        except TimeoutError:
            ready = None
        if not isinstance(ready, m.WorkerReady):
            link.kill()
            await asyncio.to_thread(link.join, SHUTDOWN_TIMEOUT_S)
            why = "did not start in time" if ready is None else "exited during startup"
            raise OperationFailed(f"the new {op.worker_id} process on {device} {why}")
        link.ready = ready
        return link

    def spec_for(self, worker_id: str, role: WorkerRole, device: str) -> WorkerSpec:
        """The spec `worker_id` runs with on `device`: its own, or for a worker this fleet did not start
        (a new one, or another fleet's checkpoint) its peers', with that id and role and the role's weight
        format; pinned to its cores as the fleet's slots are."""
        specs = self.state.specs
        base = specs[worker_id] if worker_id in specs else next(iter(specs.values()))
        live = [v.device for v in self.state.views.values() if v.state in LIVE]
        engine = dataclasses.replace(base.engine, quantization=self.state.config.quantization_for(role))
        return dataclasses.replace(base, worker_id=worker_id, role=role, device=device, engine=engine,
                                   cores=pinned_cores(device, live), memory_share=memory_share(device, live))

    @staticmethod
    async def shut_down(link: WorkerLink) -> None:
        """Ask the process to exit and reap it (killed if it has not exited in SHUTDOWN_TIMEOUT_S)."""
        link.send(m.Shutdown())
        await asyncio.to_thread(link.join, SHUTDOWN_TIMEOUT_S)
