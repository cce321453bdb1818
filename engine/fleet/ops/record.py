"""A long operation on the fleet's workers as an operator follows it (`/fleet/operations/{id}`): its kind,
the worker it acts on, its state and stage, and when it ends its result or its error."""

import time
import uuid
from dataclasses import dataclass, field
from enum import StrEnum

from fleetctl.engine.fleet.ops.results import OperationResult


class OpKind(StrEnum):
    CHECKPOINT = "checkpoint"
    RESTORE = "restore"
    MIGRATE = "migrate"
    MOVE = "move"  # one session moved live to another worker of its role (`ops/session_move.py`)
    START = "start"
    DRAIN = "drain"
    RESUME = "resume"
    STOP = "stop"
    RESTART = "restart"  # the supervisor brings a worker that died back (supervisor.py)
    REBALANCE = "rebalance"  # several workers change role, one after another (`ops/rebalance.py`)
    SWITCH = "switch"  # one worker changes role in place, its process kept (`ops/switch.py`)


class OpState(StrEnum):
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"  # called off by a later operation (a drain cut short by resume)


@dataclass
class Operation:
    kind: OpKind
    worker_id: str
    device: str | None = None  # where the operation starts a process: reserved while it runs
    id: str = field(default_factory=lambda: f"op-{uuid.uuid4().hex[:12]}")
    state: OpState = OpState.RUNNING
    step: str = "queued"  # one of its kind's stages (`ops/stages.py`)
    stage: str = "queued"  # the step as people read it, with its detail: "draining: 3 session(s) left"
    started: float = field(default_factory=time.time)
    result: OperationResult | None = None
    error: str | None = None
    writer_pid: int | None = None
    destination_pid: int | None = None

    def at(self, step: StrEnum, detail: str = "") -> None:
        """The operation reached `step` (one of its kind's stages); `detail` says more ("3 session(s) left")."""
        self.step, self.stage = step.value, f"{step.value}: {detail}" if detail else step.value
