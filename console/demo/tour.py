"""`fleetctl demo --tour`: the demo performs, one step at a time and at a pace a room can follow, what makes the
fleet different — a live migration, a role switch under streams, a checkpoint and its restore, a worker killed
and its streams going on, a rebalance to the layout the planner advises — while its traffic streams. Each step is
announced (a line on stderr, or the console's tour banner), done through the fleet's API as an operator would, and
checked: a step that fails says why and the tour goes on. Runs in a thread of its own beside the traffic."""

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import psutil

from fleetctl.console.client import FleetClient, FleetClientError
from fleetctl.domain import WorkerRole, WorkerState
from fleetctl.engine.api.device_names import free_devices
from fleetctl.engine.api.operations import OperationInfo, OpState, describe
from fleetctl.engine.api.reports import layout_label
from fleetctl.engine.api.status import WorkerInfo

STEP_TIMEOUT_S = 240.0  # an operation (a worker's start loads the model) or a restart taking longer failed
RUNNING = WorkerState.RUNNING.value


class TourFailed(Exception):
    """A step cannot be done on this fleet now (no worker to act on, no free device): the step fails, saying so."""


@dataclass(frozen=True)
class TourStep:
    name: str
    ok: bool
    seconds: float
    result: str  # what happened: the operation's sentence (the CLI's), or why the step failed

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'} {self.name:<22} {self.seconds:6.1f} s  {self.result}"

    def as_json(self) -> dict[str, object]:
        return asdict(self)


class Tour:
    def __init__(self, client: FleetClient, announce: Callable[[str], None], pause_s: float = 10.0) -> None:
        self.client = client
        self.announce = announce
        self.pause_s = pause_s  # between steps: the panels show each step's effect before the next
        self.steps: list[TourStep] = []
        self.stopped = threading.Event()

    def run(self) -> list[TourStep]:
        """Every step, in order, `pause_s` before each, unless `stopped` is set (the demo ended first)."""
        for name, step in (("live migration", self._migrate), ("role switch", self._switch),
                           ("checkpoint and restore", self._checkpoint_and_restore),
                           ("worker killed", self._kill), ("rebalance", self._rebalance)):
            if self.stopped.wait(self.pause_s):  # the traffic builds up first, and each step's effect shows
                break
            started = time.monotonic()
            try:
                result = step()
                ok = True
            except (TourFailed, FleetClientError) as exc:
                result, ok = str(exc), False
            except Exception as exc:  # a bug of the tour's own: this step says so, the tour goes on
                result, ok = f"{exc.__class__.__name__}: {exc}", False
            self.steps.append(TourStep(name, ok, round(time.monotonic() - started, 1), result))
            self.announce(f"{'done' if ok else 'failed'}: {result}")
        return self.steps

    # ---- the steps: each announces itself, acts, and returns what happened (raises TourFailed if it did not) ----

    def _migrate(self) -> str:
        worker = self._busiest(WorkerRole.DECODE)
        device = self._free_device()
        self.announce(f"Live migration: {worker.id} moves from {worker.device} to {device} while it decodes — its "
                      f"{worker.sessions} session(s) move with it and keep streaming")
        return self._operation(f"/fleet/workers/{worker.id}/migrate", {"to": device})

    def _switch(self) -> str:
        worker = self._busiest(WorkerRole.DECODE)
        self.announce(f"Role switch: {worker.id} becomes a mixed worker in place — the same process, weights and KV; "
                      f"it takes prompts and keeps decoding its {worker.sessions} session(s)")
        return self._operation(f"/fleet/workers/{worker.id}/switch", {"role": WorkerRole.MIXED.value})

    def _checkpoint_and_restore(self) -> str:
        worker = self._busiest(WorkerRole.DECODE)
        self.announce(f"Checkpoint: {worker.id} stands down with its {worker.sessions} session(s) saved to disk, "
                      f"then comes back from them on another device")
        op = self._follow(self.client.start(f"/fleet/workers/{worker.id}/checkpoint", {}))
        saved = op.result.model_dump().get("checkpoint") if op.result is not None else None
        if saved is None:
            raise TourFailed(f"the checkpoint did not end with a checkpoint: {describe(op)}")
        restored = self._operation("/fleet/restore", {"checkpoint": saved, "device": self._free_device()})
        return f"{describe(op)}; {restored}"

    def _kill(self) -> str:
        worker = self._busiest(WorkerRole.DECODE)
        if worker.pid is None or not psutil.pid_exists(worker.pid):
            raise TourFailed(f"{worker.id}'s process is not on this machine: only a local fleet's worker is killed")
        self.announce(f"Worker killed: {worker.id}'s process ({worker.pid}) gets SIGKILL — its streams are "
                      f"recomputed on its peers and the supervisor starts it again")
        killed_at = time.monotonic()
        os.kill(worker.pid, signal.SIGKILL)
        deadline = killed_at + STEP_TIMEOUT_S
        while time.monotonic() < deadline and not self.stopped.is_set():
            back = self._worker(worker.id)
            if back is not None and back.state == RUNNING and back.pid not in (None, worker.pid):
                return (f"{worker.id} was killed holding {worker.sessions} session(s), which the fleet recomputed "
                        f"on its peers; it runs again as process {back.pid} after "
                        f"{time.monotonic() - killed_at:.1f} s")
            time.sleep(0.2)
        raise TourFailed(f"{worker.id} was not running again within {STEP_TIMEOUT_S:g} s of its kill")

    def _rebalance(self) -> str:
        """To the layout the plan advises (the split regret's replay, its 5 min window; a fleet from before the
        advice: the recommended one): none when the advice is to keep the current one."""
        plan = self.client.plan({"since": "5m"})
        running = [w.role for w in self._workers() if w.state == RUNNING]
        current = layout_label(*(running.count(role.value) for role in WorkerRole))
        advice = plan.advice if plan.advice and plan.advice.verdict != "unknown" else None
        best = plan.recommended
        target = advice.layout if advice else layout_label(best.prefill, best.decode, best.mixed)
        why = f"the advice: {advice.sentence}" if advice else f"its reason: {plan.reason}"
        if target == current:
            self.announce(f"Rebalance: the planner keeps {current} ({why})")
            return f"the fleet is at the planner's layout {current} already: nothing to move"
        self.announce(f"Rebalance: {current} → {target}, the planner's layout ({why})")
        return self._operation("/fleet/rebalance", {"split": target, "apply": True})

    # ---- helpers ----------------------------------------------------------------------------------------------

    def _operation(self, path: str, body: dict[str, object]) -> str:
        return describe(self._follow(self.client.start(path, body)))

    def _follow(self, op: OperationInfo) -> OperationInfo:
        op = self.client.follow(op, STEP_TIMEOUT_S)
        if op.state is not OpState.DONE:
            raise TourFailed(describe(op) if op.state is not OpState.RUNNING else
                             f"{op.kind} {op.worker} still runs after {STEP_TIMEOUT_S:g} s")
        return op

    def _workers(self) -> list[WorkerInfo]:
        return self.client.workers().workers

    def _worker(self, worker_id: str) -> WorkerInfo | None:
        return next((w for w in self._workers() if w.id == worker_id), None)

    def _busiest(self, role: WorkerRole) -> WorkerInfo:
        """The running worker of `role` holding the most sessions (the one whose step shows most)."""
        running = [w for w in self._workers() if w.role == role.value and w.state == RUNNING]
        if not running:
            raise TourFailed(f"no running {role.value} worker to act on")
        return max(running, key=lambda w: (w.sessions, w.id))

    def _free_device(self) -> str:
        free = free_devices(self._workers(), count=1)
        if not free:
            raise TourFailed("no free device to move to")
        return free[0]
