"""`switch`: a worker changes role in place — the same process, its weights, KV pool and prefix cache kept
(no model load, no calibration) — and takes the next id of its new role (`was` names the old one).

1. It is routed nothing new (draining); a decode or mixed worker's sessions move live to peers that decode
   (decode or mixed workers). Between two roles that decode (decode ⇄ mixed), what cannot move (no peer
   decodes, or none has room) stays and is continued by the same process in its new role; otherwise it
   finishes where it is, like a prefill worker's prompts and the handoffs of their KV. A `resume` calls the
   switch off here: the worker serves its old role again.
2. Holding no session (or, between roles that decode, only what it keeps), the process re-lays itself
   (`SwitchRole`: whether steps park after prefill, which decode step runs) and answers. Commit or abort: an
   answer that it failed (or no answer, or its exit) leaves it under its old id and role, and a live process
   serves that role again.
3. Commit: the controller renames it — and the sessions it kept, which name it by its new id — the store
   records the old id stopped and the new one started, and routing takes it as its new role. Requests it
   prefilled that decode elsewhere keep the old id as their prefill worker: that is who prefilled them.

Any role may become any other: a fleet runs prefill, decode and mixed workers side by side.

Refused (4xx, nothing changed): an unknown or busy worker, a role the worker already has, the last running
worker to take prompts or to decode when its new role does not (the last one to decode may become mixed:
handoffs wait for it while it switches), and roles that serve
different weight formats (`--prefill-quantization`/`--decode-quantization`: a switch keeps the weights, so it
would serve the other role's format)."""

import asyncio
import time

from fleetctl.domain import EventKind, WorkerRole, WorkerState
from fleetctl.engine.api.operation_results import SwitchResult
from fleetctl.engine.api.operations import OpKind
from fleetctl.engine.api.stages import SwitchStage
from fleetctl.engine.fleet import placement
from fleetctl.engine.fleet.errors import OperationFailed, OperationRefused
from fleetctl.engine.fleet.ops.lifecycle import WorkerLifecycle
from fleetctl.engine.fleet.ops.record import Operation
from fleetctl.engine.fleet.ops.runner import Awaited, OperationRunner
from fleetctl.engine.fleet.worker_view import WorkerView
from fleetctl.engine.worker import protocol as m

SWITCH_TIMEOUT_S = 120.0  # the re-layout warms the new role's kernels up: on a GPU, a Triton compile or two


class RoleSwitches:
    def __init__(self, runner: OperationRunner, lifecycle: WorkerLifecycle) -> None:
        self.runner = runner
        self.lifecycle = lifecycle
        self.state = runner.state

    def switch(self, worker_id: str, role: str) -> Operation:
        view = self.runner.running_worker(worker_id)
        new_role = self.lifecycle.fleet_role(role)
        if new_role is view.role:
            raise OperationRefused(409, f"{worker_id} is already a {new_role.value} worker")
        config = self.state.config
        old_format, new_format = config.quantization_for(view.role), config.quantization_for(new_role)
        if old_format is not new_format:
            raise OperationRefused(409, f"this fleet serves {view.role.value} workers {old_format.value} weights and "
                                        f"{new_role.value} workers {new_format.value}: a switch keeps the weights it "
                                        f"loaded; stop {worker_id} and start a {new_role.value} worker instead")
        self.lifecycle.check_not_last(view, "switch", becoming=new_role)
        op = Operation(OpKind.SWITCH, worker_id)
        self.lifecycle.begin_drain(view, op)
        self.runner.bringing(op, new_role)  # what waits for its new role's work waits for it (FleetState.serves)
        return self.runner.launch(op, self._switch(op, view, new_role))

    async def _switch(self, op: Operation, view: WorkerView, role: WorkerRole) -> SwitchResult:
        started, old_id, old_role, held = time.time(), view.worker_id, view.role, len(view.requests)
        keeps = old_role.covers(WorkerRole.DECODE) and role.covers(WorkerRole.DECODE)  # its sessions may stay
        moved = await self.lifecycle.vacate(op, view, old_role.covers(WorkerRole.DECODE), SwitchStage.MOVING_SESSIONS,
                                            SwitchStage.DRAINING, hold=keeps)
        kept = len(view.requests)
        op.at(SwitchStage.SWITCHING, f"{kept} session(s) kept" if kept else "")
        new_id = self.lifecycle.next_id(role)
        link = self.state.links[old_id]
        answer = self.runner.expect(old_id, Awaited.SWITCHED)
        link.send(m.SwitchRole(role, new_id))
        try:
            reply = await asyncio.wait_for(answer, SWITCH_TIMEOUT_S)
        except TimeoutError:
            reply = m.SwitchFailed(f"no answer in {SWITCH_TIMEOUT_S:g} s")
        if not isinstance(reply, m.RoleSwitched):
            assert isinstance(reply, m.SwitchFailed)
            if view.state is WorkerState.DRAINING:  # alive (an exit fails it): it serves its old role again
                view.state = WorkerState.RUNNING
            raise OperationFailed(f"the switch of {old_id} to {role.value} was called off: {reply.reason}; "
                                  f"{old_id} is {view.state.value} as a {old_role.value} worker")
        self._commit(old_id, new_id, role)
        seconds = round(time.time() - started, 3)  # it took no new work all along
        result = SwitchResult(worker=new_id, was=old_id, from_=old_role.value, to=role.value, pid=view.pid,
                              sessions_finished=held - moved - kept, sessions_moved=moved,
                              switch_s=round(reply.seconds, 4), out_of_service_s=seconds, seconds=seconds,
                              sessions_kept=kept)
        self.state.record_event(EventKind.SWITCH, new_id, result.model_dump(exclude={"kind", "worker"}))
        return result

    def _commit(self, old_id: str, new_id: str, role: WorkerRole) -> None:
        """The process answered as `new_id`: the controller, the store and routing follow."""
        state = self.state
        recorder = state.recorder
        if recorder:
            recorder.worker_stopped(state.views[old_id], WorkerState.STOPPED, {"switched_to": new_id})
        _, view = state.switch_role(old_id, new_id, role)
        placement.rename([state.requests[rid] for rid in view.requests if rid in state.requests], old_id, new_id)
        view.state = WorkerState.RUNNING
        if recorder:
            recorder.worker_started(view)
        self.runner.host.routing_changed()
