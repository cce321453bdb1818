"""What the controller's parts share: the worker table as the controller sees it, the requests it follows,
the two queues, where live numbers go, and the few questions every part asks of them (`serves`,
`covers`). Plain state, handed to the parts that act on requests and workers (dispatch, handoff,
recovery, operations); a part that needs less gets less (the watchdog: the views and links, the router:
owned by dispatch).

Who writes what (everyone may read):
- `config`: nobody after the assembly (`Fleet`).
- `specs`, `views`, `links` (the worker table, keyed by worker id): `Fleet` (the workers it starts,
  `take_over` when a process becomes a worker id), the live migration (`rename_worker`,
  `forget_worker` for its standby) and a role switch (`switch_role`) — nothing else adds, renames or drops
  an id. `retired_ids`: the ids switched workers left, never given again. A view's fields: the
  worker's reports (`worker_inbox`), its KV blocks (`view.kv`, a `WorkerKV`, their only writer: the handlers
  tell it what happened), the requests it holds (`placement` only), its state (the part acting on the
  worker: recovery, the operations).
- `requests`: `Admission.admit` adds, `Dispatcher` removes (every ending goes through it).
- `queued`: `Admission.admit` appends, `Dispatcher` takes (and puts back recomputed prompts).
- `pending_handoffs`: `HandoffRouting` (`wait_for_decode`); `Dispatcher.cancel` drops a cancelled one.
- `restarting`: the `Supervisor`. `arriving`: the `OperationRunner` (`bringing`).
- `closing`: `Fleet.drain`; `stopping`: `Fleet.stop`.
- `stats`, `recorder`, `logs`: made by `Fleet`; every part reports into them (`logs` follows a renamed worker)."""

import dataclasses
from collections import deque
from dataclasses import dataclass, field

from fleetctl.domain import EventKind, WorkerRole, WorkerState
from fleetctl.engine.fleet.fleet_config import FleetConfig
from fleetctl.engine.fleet.logs import FleetLogs
from fleetctl.engine.fleet.recorder import FleetRecorder
from fleetctl.engine.fleet.request import TrackedRequest
from fleetctl.engine.fleet.router import Router
from fleetctl.engine.fleet.stats import FleetStats
from fleetctl.engine.fleet.tracing import RequestTracer
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
    links: dict[str, WorkerLink] = field(default_factory=dict)  # the current process of each worker id
    requests: dict[str, TrackedRequest] = field(default_factory=dict)  # accepted and not yet ended
    queued: deque[TrackedRequest] = field(default_factory=deque)  # waiting for a prefill (or mixed) worker
    pending_handoffs: deque[TrackedRequest] = field(default_factory=deque)  # KV published, no decode worker yet
    restarting: dict[str, WorkerRole] = field(default_factory=dict)  # worker id -> role, a restart pending
    # operation id -> role of the worker it brings: the process it starts, or the one it pauses for a checkpoint
    arriving: dict[str, WorkerRole] = field(default_factory=dict)
    closing: bool = False  # shutting down: no new request is admitted
    stopping: bool = False  # the fleet is stopping: a worker exiting now stopped (not failed, not restarted)
    retired_ids: set[str] = field(default_factory=set)  # ids a worker left when it switched role
    logs: FleetLogs = field(default_factory=lambda: FleetLogs(None))  # the fleet's and its workers' recent lines
    tracer: RequestTracer | None = None  # each ended request's trace, exported over OTLP (--otlp-endpoint)

    def take_over(self, worker_id: str, link: WorkerLink) -> None:
        """`link`'s process becomes `worker_id`, with the spec it was launched with (a new id gets its view)."""
        spec = link.launched.spec
        self.links[worker_id], self.specs[worker_id] = link, spec
        view = self.views.get(worker_id)
        if view is None:
            view = self.views[worker_id] = WorkerView(worker_id, spec.role, spec.device)
        view.device, view.node, view.node_lost = spec.device, link.launched.node, False

    def rename_worker(self, old: str, new: str) -> tuple[WorkerLink, WorkerView]:
        """The worker `old` is known as `new` from now on: its link, view and spec (a migration's standby
        taking over the worker it replaces)."""
        link, view = self.links.pop(old), self.views.pop(old)
        spec = self.specs.pop(old)
        self.logs.rename(old, new)
        link.worker_id = view.worker_id = new
        self.links[new], self.views[new] = link, view
        self.specs[new] = dataclasses.replace(spec, worker_id=new)
        return link, view

    def switch_role(self, old: str, new: str, role: WorkerRole) -> tuple[WorkerLink, WorkerView]:
        """The worker `old` serves `role` as `new` from now on, the same process (`ops/switch.py`)."""
        link, view = self.rename_worker(old, new)
        view.role, view.was = role, old
        self.specs[new] = dataclasses.replace(self.specs[new], role=role)
        self.retired_ids.add(old)
        return link, view

    def forget_worker(self, worker_id: str) -> None:
        """`worker_id` is gone for good (a called-off migration's standby)."""
        for table in (self.links, self.views, self.specs):
            table.pop(worker_id, None)

    def send(self, worker_id: str, msg: object) -> None:
        self.links[worker_id].send(msg)

    def all_views(self) -> list[WorkerView]:
        return list(self.views.values())

    def covers(self, phase: WorkerRole) -> bool:
        """A running (or starting) worker does `phase`'s work: PREFILL takes prompts, DECODE decodes."""
        return Router.covered(self.all_views(), phase)

    def serves(self, phase: WorkerRole) -> bool:
        """A worker doing `phase`'s work runs or starts, or one is on its way back (restarted by the supervisor,
        started or paused for a checkpoint by an operation, stood down with its hold running): requests for the
        phase may wait for it, each wait bounded (start timeout, crash budget, checkpoint timeout, hold).
        Otherwise they fail: no worker of the phase is left."""
        coming = [*self.restarting.values(), *self.arriving.values(),
                  *(v.role for v in self.views.values() if v.state is WorkerState.CHECKPOINTED)]
        return self.covers(phase) or any(role.covers(phase) for role in coming)

    def phase_workers(self, phase: WorkerRole) -> str:
        """Who does `phase`'s work, for an error saying none is left: "decode", or "decode or mixed" when the
        fleet has had mixed workers beside others."""
        roles = {v.role for v in self.views.values()} | set(self.config.roles)
        if roles == {WorkerRole.MIXED}:
            return WorkerRole.MIXED.value
        return f"{phase.value} or mixed" if WorkerRole.MIXED in roles else phase.value

    def lost_nodes_note(self, phase: WorkerRole) -> str:
        """For an error saying no worker of `phase` is left: " (the Ray cluster lost the node of decode-0 on
        node3)" when that is why, else ""."""
        lost = sorted(f"{v.worker_id} on {v.node}" for v in self.views.values() if v.role.covers(phase)
                      and v.node_lost)
        return f" (the Ray cluster lost the node of {', '.join(lost)})" if lost else ""

    def record_event(self, kind: EventKind, worker_id: str | None, details: dict) -> None:
        if self.recorder:
            self.recorder.event(kind, worker_id, details)
