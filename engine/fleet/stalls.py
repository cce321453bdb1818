"""Stalled workers: a running or draining worker that holds work — sequences running, or prompts routed to it —
and has not reported a step for STALL_STEPS times its recent step time (at least STALL_FLOOR_S) is *stalled*:
stopped (SIGSTOP), stuck in a step that does not end, starved of its device. The watchdog kills a worker only
after `--heartbeat-timeout` seconds of silence, and never one whose heartbeat goes on through an endless step;
a stall shows sooner and in both cases. It is a signal, not an action: the worker is named stalled in
`/fleet/status` (`stalled_s`), `/metrics` (`fleet_worker_stalled_seconds`) and the console, and an event is
recorded when the stall begins and when the worker steps again.

A worker an operation pauses on purpose (a checkpoint writing its state, a migration, a switch re-laying itself)
is not stalled while that operation runs: the operation has its own timeout."""

import logging
import time
from collections.abc import Callable

from fleetctl.domain import EventKind, WorkerState
from fleetctl.engine.api.operations import OpKind
from fleetctl.engine.fleet.ops.record import Operation
from fleetctl.engine.fleet.worker_view import WorkerView

log = logging.getLogger(__name__)

STALL_STEPS = 10.0  # silent this many times its recent step time...
STALL_FLOOR_S = 5.0  # ...and at least this long (a CPU fleet's prefill chunk under contention takes seconds): a stall
WATCHED = (WorkerState.RUNNING, WorkerState.DRAINING)
PAUSING = (OpKind.CHECKPOINT, OpKind.MIGRATE, OpKind.SWITCH)  # operations that hold a worker's steps on purpose


def stall_bound(view: WorkerView) -> float:
    """Seconds without a step after which `view`, holding work, counts as stalled."""
    return max(STALL_STEPS * view.recent_step_s, STALL_FLOOR_S)


def holds_work(view: WorkerView) -> bool:
    """Sequences ran on it at its last step, or prompts routed to it wait to be computed: it should step."""
    return bool(view.requests) and (view.running > 0 or view.prefill_backlog() > 0)


class StallWatch:
    def __init__(self, views: dict[str, WorkerView], record_event: Callable[[EventKind, str, dict], None],
                 operation_on: Callable[[str], Operation | None]) -> None:
        self.views = views  # FleetState's table, not a copy: a worker added later is watched too
        self.record_event = record_event
        self.operation_on = operation_on  # the operation running on a worker, if one is

    def paused_on_purpose(self, worker_id: str) -> bool:
        operation = self.operation_on(worker_id)
        return operation is not None and operation.kind in PAUSING

    def check(self, now: float | None = None) -> list[str]:
        """Mark the workers that stalled since the last check and clear those that stepped again (an event each);
        returns the ids of the workers stalled now."""
        now = time.monotonic() if now is None else now
        stalled = []
        for view in self.views.values():
            silent = now - view.last_step_at
            bound = stall_bound(view)
            if (view.state in WATCHED and silent > bound and holds_work(view)
                    and not self.paused_on_purpose(view.worker_id)):
                stalled.append(view.worker_id)
                if view.stalled_since is None:
                    view.stalled_since = view.last_step_at
                    log.warning("worker %s holds %d session(s) and has not stepped for %.1f s (its bound: %.1f s): "
                                "stalled", view.worker_id, len(view.requests), silent, bound)
                    self.record_event(EventKind.STALL, view.worker_id, {
                        "stalled": True, "silent_s": round(silent, 2), "bound_s": round(bound, 3),
                        "sessions": len(view.requests)})
            elif view.stalled_since is not None:
                self._ended(view, now)
        return stalled

    def _ended(self, view: WorkerView, now: float) -> None:
        stepped = view.last_step_at > view.stalled_since
        lasted = round((view.last_step_at if stepped else now) - view.stalled_since, 2)
        how = "it steps again" if stepped else f"it is {view.state.value} and holds {len(view.requests)} session(s)"
        view.stalled_since = None
        log.info("worker %s: the stall of %.1f s ended: %s", view.worker_id, lasted, how)
        self.record_event(EventKind.STALL, view.worker_id, {"stalled": False, "lasted_s": lasted, "ended": how})
