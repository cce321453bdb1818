"""What the controller's parts share: the workers as the controller sees them, the requests it
follows, the two queues, and where live numbers go. Plain state and the few questions every part asks
of it; the parts that act on it (dispatch, handoff, recovery, operations) each receive it."""

from collections import deque
from dataclasses import dataclass, field

from fleetctl.domain import EventKind, WorkerRole, WorkerState
from fleetctl.engine.fleet.config import FleetConfig
from fleetctl.engine.fleet.recorder import FleetRecorder
from fleetctl.engine.fleet.request import TrackedRequest
from fleetctl.engine.fleet.router import Router
from fleetctl.engine.fleet.stats import FleetStats
from fleetctl.engine.fleet.worker_link import WorkerLink
from fleetctl.engine.fleet.worker_view import WorkerView
from fleetctl.engine.worker.spec import WorkerSpec


@dataclass
class FleetState:
    config: FleetConfig
    specs: dict[str, WorkerSpec]  # how each worker id is (re)started
    views: dict[str, WorkerView]
    stats: FleetStats
    recorder: FleetRecorder | None
    router: Router = field(default_factory=Router)
    links: dict[str, WorkerLink] = field(default_factory=dict)  # the current process of each worker id
    requests: dict[str, TrackedRequest] = field(default_factory=dict)  # accepted and not yet ended
    queued: deque[TrackedRequest] = field(default_factory=deque)  # waiting for a prefill (or mixed) worker
    pending_handoffs: deque[TrackedRequest] = field(default_factory=deque)  # KV published, no decode worker yet
    restarting: dict[str, WorkerRole] = field(default_factory=dict)  # worker id -> role, a restart pending
    # operation id -> role of the worker it brings: the process it starts, or the one it pauses for a checkpoint
    arriving: dict[str, WorkerRole] = field(default_factory=dict)
    closing: bool = False  # shutting down: no new request is admitted
    stopping: bool = False

    def send(self, worker_id: str, msg: object) -> None:
        self.links[worker_id].send(msg)

    def all_views(self) -> list[WorkerView]:
        return list(self.views.values())

    def has_role(self, role: WorkerRole) -> bool:
        return Router.has_role(self.all_views(), role)

    def serves(self, role: WorkerRole) -> bool:
        """A worker of `role` runs or starts, or one is on its way back (restarted by the supervisor, started
        or paused for a checkpoint by an operation, stood down with its hold running): requests for the role
        may wait for it, each wait bounded (start timeout, crash budget, checkpoint timeout, hold). Otherwise
        they fail: no worker of the role is left."""
        return (self.has_role(role) or role in self.restarting.values() or role in self.arriving.values()
                or any(v.role is role and v.state is WorkerState.CHECKPOINTED for v in self.views.values()))

    def lost_nodes_note(self, role: WorkerRole) -> str:
        """For an error saying no `role` worker is left: " (the Ray cluster lost the node of decode-0 on node3)"
        when that is why, else ""."""
        lost = sorted(f"{v.worker_id} on {v.node}" for v in self.views.values() if v.role is role and v.node_lost)
        return f" (the Ray cluster lost the node of {', '.join(lost)})" if lost else ""

    def record_event(self, kind: EventKind, worker_id: str | None, details: dict) -> None:
        if self.recorder:
            self.recorder.event(kind, worker_id, details)
