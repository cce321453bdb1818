"""Self-healing: a worker that died (crashed, or killed as hung — not one stopped, stood down or migrated on
purpose) is restarted on its device with its spec, so the fleet returns to its configured shape. Restarts
back off exponentially (`Supervision.backoff_s`, doubled per crash in the window, capped at
`backoff_max_s`); at the `max_crashes`-th crash within `crash_window_s` the supervisor gives up and says so.
Each restart is an operation (`/fleet/operations`, kind `restart`) and an event in the store; so is giving
up. While a restart is pending, requests for the worker's role wait for it (FleetState.serves)."""

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

from fleetctl.domain import EventKind, WorkerState
from fleetctl.engine.api.operation_results import RestartResult
from fleetctl.engine.api.operations import OpKind
from fleetctl.engine.api.stages import RestartStage
from fleetctl.engine.fleet.errors import OperationFailed, OperationRefused
from fleetctl.engine.fleet.ops.record import Operation
from fleetctl.engine.fleet.ops.runner import OperationRunner
from fleetctl.engine.fleet.state import FleetState

log = logging.getLogger(__name__)
BUSY_POLL_S = 0.05


class Supervisor:
    def __init__(self, runner: OperationRunner, on_gave_up: Callable[[], None]) -> None:
        self.runner = runner
        self.state: FleetState = runner.state
        self.policy = runner.state.config.supervision
        self._on_gave_up = on_gave_up  # requests waiting for the role may have nothing left to wait for
        self._crashes: dict[str, deque[float]] = {}
        self._tasks: set[asyncio.Task] = set()

    def on_failure(self, worker_id: str) -> None:
        """`worker_id` died: restart it after its backoff, or give up."""
        busy = self.runner.busy_with(worker_id)
        if not self.policy.restart or self.state.stopping or self.state.closing:
            return
        if busy is not None and busy.kind is OpKind.STOP:  # it was on its way out anyway
            return
        if busy is not None and busy.worker_id != worker_id:  # a migration's standby: the migration settles it
            return
        now = time.monotonic()
        crashes = self._crashes.setdefault(worker_id, deque())
        crashes.append(now)
        while crashes[0] < now - self.policy.crash_window_s:
            crashes.popleft()
        if len(crashes) >= self.policy.max_crashes:
            self._give_up(worker_id, f"{worker_id} failed {len(crashes)} times in {self.policy.crash_window_s:g} s")
            return
        delay = min(self.policy.backoff_s * 2 ** (len(crashes) - 1), self.policy.backoff_max_s)
        self.state.restarting[worker_id] = self.state.views[worker_id].role
        task = asyncio.get_running_loop().create_task(self._restart_after(worker_id, delay, len(crashes)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    async def _restart_after(self, worker_id: str, delay: float, attempt: int) -> None:
        await asyncio.sleep(delay)
        while self.runner.busy_with(worker_id):  # an operation on it when it died ends first
            await asyncio.sleep(BUSY_POLL_S)
        view = self.state.views[worker_id]
        if view.state is not WorkerState.FAILED or self.state.stopping or self.state.closing:
            self.state.restarting.pop(worker_id, None)  # restored or replaced meanwhile, or shutting down
            return
        try:
            self.runner.check_device(view.device, exclude=worker_id)
        except OperationRefused as exc:
            self._give_up(worker_id, f"{worker_id} cannot restart on {view.device}: {exc}")
            return
        op = Operation(OpKind.RESTART, worker_id, device=view.device)
        op.at(RestartStage.BACKING_OFF, f"crash {attempt} in {self.policy.crash_window_s:g} s, after {delay:g} s")
        self.runner.launch(op, self._restart(op, delay, attempt))

    async def _restart(self, op: Operation, delay: float, attempt: int) -> RestartResult:
        view = self.state.views[op.worker_id]
        try:
            link = await self.runner.start_process(op, view.role, view.device, RestartStage.STARTING_PROCESS)
        except OperationFailed:
            self.state.restarting.pop(op.worker_id, None)
            self.on_failure(op.worker_id)  # a restart that does not start counts as a crash
            raise
        self.state.restarting.pop(op.worker_id, None)
        self.runner.host.take_over(op.worker_id, link, link.ready)
        details = {"device": view.device, "pid": link.pid, "attempt": attempt, "backoff_s": delay}
        self.state.record_event(EventKind.RESTART, op.worker_id, details)
        log.warning("worker %s restarted on %s (pid %s) after %g s", op.worker_id, view.device, link.pid, delay)
        return RestartResult(worker=op.worker_id, device=view.device, pid=link.pid, attempt=attempt, backoff_s=delay)

    def _give_up(self, worker_id: str, why: str) -> None:
        self.state.restarting.pop(worker_id, None)
        view = self.state.views[worker_id]
        message = (f"{why}; not restarted again (start one with `fleetctl start --role {view.role.value} "
                   f"--device {view.device}`)")
        view.last_error = message
        log.error("worker %s: %s", worker_id, message)
        self.state.record_event(EventKind.GAVE_UP, worker_id, {"reason": why,
                                                                "crashes": len(self._crashes.get(worker_id, ()))})
        self._on_gave_up()
