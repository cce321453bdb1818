"""`rebalance`: move a fleet to another layout — a prefill:decode split, colocated, or prefill, decode and
mixed workers side by side (P:D:M) — one worker at a time, without losing a session. A layout on more
devices than the fleet runs starts workers on its free devices (`FleetConfig.pool`: `--devices` beyond the
workers) first; one on fewer stops the workers of roles in excess holding the fewest sessions last, their
decoding sessions moved live to peers.
Each worker that changes role has its sessions leave it (see `Evacuation`) and then, `Via` the default
switch, re-lays itself in place (`switch.py`: the same process, no model load), or via restart is stopped
and a worker of its new role started on its device. Either way it takes a fresh id of its new role, as
`start` gives. Each step is an operation of `lifecycle` or
`switch`; the rebalance is one operation over them that an operator polls like the others.

Refused (4xx, nothing changed): a split that does not parse, has an empty role, or needs more devices than
the fleet's running and free ones; a fleet already at that split; another operation running or a worker starting or
draining; and with `force`, a worker whose sessions would not fit on its peers.

Only workers of a role in excess change, each to a role short of workers, in an order that keeps a running
worker taking prompts and one decoding beside the worker that changes wherever the layouts allow (1:1 to
colocated 2 does not: there, requests wait for the switching worker, which covers both roles after)."""

import asyncio
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from fleetctl.domain import EventKind, WorkerRole, WorkerState
from fleetctl.engine.api.device_names import gpu_clash
from fleetctl.engine.api.operation_results import (
    DrainResult,
    OperationResult,
    RebalancePreview,
    RebalanceResult,
    RoleChange,
    RoleChanged,
    StartResult,
    StopResult,
    SwitchResult,
    WorkerStart,
    WorkerStop,
)
from fleetctl.engine.api.operations import OpKind, OpState
from fleetctl.engine.api.reports import layout_label
from fleetctl.engine.api.stages import RebalanceStage
from fleetctl.engine.core.block_allocator import blocks_for
from fleetctl.engine.fleet.errors import FleetError, OperationFailed, OperationRefused
from fleetctl.engine.fleet.ops.lifecycle import WorkerLifecycle
from fleetctl.engine.fleet.ops.record import Operation
from fleetctl.engine.fleet.ops.runner import LIVE, OperationRunner
from fleetctl.engine.fleet.ops.switch import RoleSwitches
from fleetctl.engine.fleet.worker_view import WorkerView
from fleetctl.engine.planner.split import Split, parse_split
from fleetctl.errors import UserError

POLL_S = 0.05
R = TypeVar("R", bound=OperationResult)
FLEET = "fleet"  # the operation's `worker`: a rebalance acts on the whole fleet


class Evacuation(StrEnum):
    """How a worker's sessions leave it before it changes role."""

    # the default: a decode worker's sessions move live to its peers between two steps (`drain --move`;
    # what cannot move finishes in place); a prefill worker's (KV awaiting a handoff) finish where they are
    MOVE = "move"
    FINISH = "finish"  # drain: they finish where they are; it takes no new work meanwhile
    RECOMPUTE = "recompute"  # `force`: recomputed at once on its peers from their tokens


class Via(StrEnum):
    """How a worker changes role."""

    SWITCH = "switch"  # the same process re-lays itself (`switch.py`); the default where the roles' weights agree
    RESTART = "restart"  # stopped, and a worker of the other role started on its device (loads the model again)


@dataclass(frozen=True)
class RebalanceSteps:
    """What a rebalance does, in this order: start workers on free devices, change roles, stop workers."""

    starts: list[WorkerStart]
    changes: list[RoleChange]
    stops: list[WorkerStop]

    def __bool__(self) -> bool:
        return bool(self.starts or self.changes or self.stops)


class Rebalancer:
    def __init__(self, runner: OperationRunner, lifecycle: WorkerLifecycle, switches: RoleSwitches) -> None:
        self.runner = runner
        self.state = runner.state
        self.lifecycle = lifecycle
        self.switches = switches

    def running_operation(self) -> Operation | None:
        return next((op for op in self.runner.ops.values() if op.state is OpState.RUNNING), None)

    def counts(self) -> dict[WorkerRole, int]:
        """Running workers per role."""
        running = [v.role for v in self.state.views.values() if v.state is WorkerState.RUNNING]
        return {role: running.count(role) for role in WorkerRole}

    def current(self) -> str:
        counts = self.counts()
        return layout_label(counts[WorkerRole.PREFILL], counts[WorkerRole.DECODE], counts[WorkerRole.MIXED])

    def preview(self, split: str, force: bool, via: str | None = None) -> RebalancePreview:
        """The dry run: what `start` would do."""
        target = self._parse(split)
        how = self._via(via, force)
        steps = self.steps(target, force)
        return RebalancePreview(split=target.label, current=self.current(), force=force,
                                evacuation=_evacuation(force).value, moves=steps.changes, via=how.value,
                                starts=steps.starts, stops=steps.stops)

    def start(self, split: str | Split, force: bool, via: str | None = None) -> Operation:
        target = self._parse(split) if isinstance(split, str) else split
        how = self._via(via, force)
        steps = self.steps(target, force)
        if not steps:
            raise OperationRefused(409, f"the fleet is already at split {target.label}")
        op = Operation(OpKind.REBALANCE, FLEET)
        return self.runner.launch(op, self._run(op, target, steps, _evacuation(force), how))

    def elastic_devices(self, limit: int | None = None) -> list[str] | None:
        """What an elastic plan of this fleet lays its layouts over: its live workers' devices, then its free ones,
        `limit` at most; None when it has no free device (its plan is over its own devices)."""
        free = self.free_devices()
        if not free:
            return None
        live = [v.device for v in self.state.views.values() if v.state in LIVE]
        return (live + free)[:limit]

    def free_devices(self) -> list[str]:
        """The fleet's devices (`FleetConfig.pool`) that no live worker runs on, in the pool's order."""
        live = [v.device for v in self.state.views.values() if v.state in LIVE]
        return [device for device in self.state.config.pool if gpu_clash(device, live) is None]

    def _via(self, via: str | None, force: bool) -> Via:
        """`via` as asked, or by default a switch unless `force` (a stop's recompute) or the roles serve different
        weight formats (a switch keeps the weights) call for a restart."""
        config = self.state.config
        formats_agree = len({config.quantization_for(role) for role in WorkerRole}) == 1
        if via is None:
            return Via.SWITCH if formats_agree and not force else Via.RESTART
        try:
            how = Via(via)
        except ValueError:
            raise OperationRefused(400, f"unknown --via {via!r}: use switch or restart") from None
        if how is Via.SWITCH and force:
            raise OperationRefused(400, "--force recomputes sessions on peers as a worker stops: use --via restart "
                                        "with it (a switch moves them live)")
        if how is Via.SWITCH and not formats_agree:
            raise OperationRefused(409, "this fleet's roles serve different weight formats and a switch keeps the "
                                        "weights it loaded: use --via restart")
        return how

    @staticmethod
    def _parse(split: str) -> Split:
        try:
            return parse_split(split)
        except UserError as exc:
            raise OperationRefused(400, str(exc)) from None

    def steps(self, target: Split, force: bool) -> RebalanceSteps:
        """What reaching `target` takes, in order; raises OperationRefused."""
        busy = self.running_operation()
        if busy is not None:
            raise OperationRefused(409, f"another operation is running ({busy.kind.value} {busy.id} on "
                                        f"{busy.worker_id}): wait for it to end")
        live = [v for v in self.state.views.values() if v.state in LIVE]
        unsettled = [f"{v.worker_id} is {v.state.value}" for v in live if v.state is not WorkerState.RUNNING]
        if unsettled:
            raise OperationRefused(409, f"{', '.join(unsettled)}: rebalance when every worker runs (resume or stop it)")
        grow, free = target.devices - len(live), self.free_devices()
        if grow > len(free):
            spare = f"its free ones: {', '.join(free)}" if free else "it has no free one"
            raise OperationRefused(400, f"split {target.label} needs {target.devices} devices and the fleet runs "
                                        f"{len(live)} ({', '.join(sorted(v.device for v in live))}); {spare} (list "
                                        f"more with `serve --devices`)")
        counts, wanted = self.counts(), {WorkerRole.PREFILL: target.prefill, WorkerRole.DECODE: target.decode,
                                         WorkerRole.MIXED: target.mixed}
        leaving = sorted((v for role in WorkerRole for v in sorted((v for v in live if v.role is role),
                                                                   key=_fewest_sessions)
                          [:max(0, counts[role] - wanted[role])]), key=_fewest_sessions)
        short = [role for role in WorkerRole for _ in range(max(0, wanted[role] - counts[role]))]
        stopping, changing = leaving[:max(0, -grow)], leaving[max(0, -grow):]
        starting, needed = short[:max(0, grow)], short[max(0, grow):]
        running = {role: counts[role] + starting.count(role) for role in WorkerRole}
        changes = _order(changing, needed, running)
        if force:
            self._check_room([v for v, _ in changes] + stopping, [v for v in live if v not in leaving])
        return RebalanceSteps(
            starts=[WorkerStart(role=role.value, device=device) for role, device in zip(starting, free, strict=False)],
            changes=[RoleChange(worker=v.worker_id, device=v.device, from_=v.role.value, to=to.value,
                                sessions=len(v.requests)) for v, to in changes],
            stops=[WorkerStop(worker=v.worker_id, device=v.device, role=v.role.value, sessions=len(v.requests))
                   for v in stopping])

    def _check_room(self, leaving: list[WorkerView], staying: list[WorkerView]) -> None:
        """Sessions recomputed on peers must fit in the free KV blocks of the peers that decode (they hold KV
        for the whole answer; a prefill worker's prompts just queue for its peers)."""
        leaving = [v for v in leaving if v.role.covers(WorkerRole.DECODE)]
        staying = [v for v in staying if v.role.covers(WorkerRole.DECODE)]
        if not leaving:
            return
        needed = sum(blocks_for(len(req.prompt_token_ids) + len(req.output_token_ids), v.kv.block_size)
                     for v in leaving for rid in v.requests if (req := self.state.requests.get(rid)) is not None)
        free = sum(v.kv.available for v in staying)
        if needed > free:
            sessions = sum(len(v.requests) for v in leaving)
            names = ", ".join(v.worker_id for v in leaving)
            raise OperationRefused(409, f"recomputing {sessions} session(s) of {names} "
                                        f"needs {needed} KV blocks and their peers have {free} free: rebalance without "
                                        f"--force (sessions finish in place) or when the load is lower")

    async def _run(self, op: Operation, target: Split, steps: RebalanceSteps, how: Evacuation,
                   via: Via) -> RebalanceResult:
        started, origin, done = time.time(), self.current(), []
        begun: list[StartResult] = []
        ended: list[StopResult] = []
        count, n = len(steps.starts) + len(steps.changes) + len(steps.stops), 0
        try:
            for start in steps.starts:
                n += 1
                begun.append(await self._follow(op, f"{n}/{count} start a {start.role} worker on {start.device}",
                                                self.lifecycle.start(start.role, start.device), StartResult))
            for change in steps.changes:
                n += 1
                step = f"{n}/{count} {change.worker} on {change.device} -> {change.to}"
                if via is Via.SWITCH:
                    switched = await self._follow(op, step, self.switches.switch(change.worker, change.to),
                                                  SwitchResult)
                    done.append(RoleChanged(**change.model_dump(by_alias=False), new_worker=switched.worker,
                                            sessions_finished=switched.sessions_finished,
                                            sessions_moved=switched.sessions_moved, seconds=switched.seconds))
                    continue
                stopped = await self._retire(op, step, change.worker, WorkerRole(change.from_), how)
                new = await self._follow(op, step, self.lifecycle.start(change.to, change.device), StartResult)
                done.append(RoleChanged(**change.model_dump(by_alias=False), new_worker=new.worker,
                                        sessions_finished=stopped.sessions_finished,
                                        sessions_moved=stopped.sessions_moved,
                                        seconds=round(stopped.seconds + new.seconds, 3)))
            for stop in steps.stops:
                n += 1
                ended.append(await self._retire(op, f"{n}/{count} stop {stop.worker} on {stop.device}", stop.worker,
                                                WorkerRole(stop.role), how))
        except FleetError as exc:
            reached = self.current()
            self.state.record_event(EventKind.REBALANCE, None, {"from": origin, "to": target.label,
                                                                **_pool_details(done, begun, ended),
                                                                "error": str(exc)})
            raise OperationFailed(f"{exc} (the fleet is at {reached} after {n - 1} of {count} step(s))") from None
        result = RebalanceResult(split=target.label, from_=origin, evacuation=how.value, moves=done,
                                 seconds=round(time.time() - started, 3), via=via.value, started=begun, stopped=ended)
        self.state.record_event(EventKind.REBALANCE, None, {"from": origin, "to": target.label,
                                                            **_pool_details(done, begun, ended),
                                                            "evacuation": how.value, "via": via.value,
                                                            "seconds": result.seconds})
        return result

    async def _retire(self, op: Operation, step: str, worker: str, role: WorkerRole, how: Evacuation) -> StopResult:
        """Stop `worker`, its decoding sessions moved live to peers first (`how` MOVE) or recomputed there
        (RECOMPUTE); the result counts both the drain's sessions and seconds and the stop's."""
        finished, moved, draining = 0, 0, 0.0
        if how is Evacuation.MOVE and role.covers(WorkerRole.DECODE):
            drained = await self._follow(op, step, self.lifecycle.drain(worker, move=True), DrainResult)
            finished, moved, draining = drained.sessions_finished, drained.sessions_moved or 0, drained.seconds
        stopped = await self._follow(op, step, self.lifecycle.stop(worker, force=how is Evacuation.RECOMPUTE),
                                     StopResult)
        seconds = round(stopped.seconds + draining, 3)  # it took no new work from the drain on
        return stopped.model_copy(update={"sessions_finished": stopped.sessions_finished + finished,
                                          "sessions_moved": stopped.sessions_moved + moved, "seconds": seconds,
                                          "out_of_service_s": seconds})

    @staticmethod
    async def _follow(op: Operation, step: str, inner: Operation, kind: type[R]) -> R:
        """Wait for one step's operation, showing its stage in the rebalance's; its result, or OperationFailed."""
        while inner.state is OpState.RUNNING:
            op.at(RebalanceStage.CHANGING_ROLES)
            op.stage = f"{step}: {inner.kind.value} {inner.worker_id}: {inner.stage}"  # the step, in people's words
            await asyncio.sleep(POLL_S)
        if inner.state is not OpState.DONE:
            raise OperationFailed(f"{inner.kind.value} of {inner.worker_id} {inner.state.value}: {inner.error}")
        assert isinstance(inner.result, kind)
        return inner.result


def _pool_details(changes: list[RoleChanged], started: list[StartResult],
                  stopped: list[StopResult]) -> dict[str, object]:
    """A rebalance event's account of what it did (`started` and `stopped` only when it did)."""
    details: dict[str, object] = {"moves": [c.model_dump() for c in changes]}
    if started:
        details["started"] = [s.model_dump() for s in started]
    if stopped:
        details["stopped"] = [s.model_dump() for s in stopped]
    return details


def _fewest_sessions(view: WorkerView) -> tuple[int, str]:
    return len(view.requests), view.worker_id


def _order(leaving: list[WorkerView], short: list[WorkerRole],
           counts: dict[WorkerRole, int]) -> list[tuple[WorkerView, WorkerRole]]:
    """Pair each leaving worker with a role short of workers, step by step: at each step the first pair
    after which another running worker still takes prompts and one decodes, else the first whose new role
    covers what it alone did (requests wait for it meanwhile)."""
    running, steps, pending, needed = dict(counts), [], list(leaving), list(short)
    while pending:
        pairs = [(v, role) for v in pending for role in dict.fromkeys(needed)]
        step = (next((p for p in pairs if _keeps_phases(running, *p, strict=True)), None)
                or next((p for p in pairs if _keeps_phases(running, *p, strict=False)), None))
        if step is None:
            raise OperationRefused(409, "no order of role changes keeps a worker taking prompts and one decoding: "
                                        "start a worker first")
        view, role = step
        pending.remove(view)
        needed.remove(role)
        running[view.role] -= 1
        running[role] += 1
        steps.append(step)
    return steps


def _keeps_phases(running: dict[WorkerRole, int], view: WorkerView, to: WorkerRole, strict: bool) -> bool:
    """While `view` changes to `to`, every phase it does has another running worker (`strict`), or `to` does
    it too."""
    for phase in (WorkerRole.PREFILL, WorkerRole.DECODE):
        others = sum(n for role, n in running.items() if role.covers(phase)) - 1
        if view.role.covers(phase) and others < 1 and (strict or not to.covers(phase)):
            return False
    return True


def _evacuation(force: bool) -> Evacuation:
    return Evacuation.RECOMPUTE if force else Evacuation.MOVE
