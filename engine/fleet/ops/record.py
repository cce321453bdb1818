"""A long operation on the fleet's workers as an operator follows it (`/fleet/operations/{id}`): its kind,
the worker it acts on, its state and stage, and when it ends its result or its error."""

import time
import uuid
from dataclasses import dataclass, field
from enum import StrEnum

from fleetctl.engine.api.operation_results import OperationResult
from fleetctl.engine.api.operations import OperationInfo, OpKind, OpState
from fleetctl.engine.api.stages import progress


@dataclass
class Operation:
    kind: OpKind
    worker_id: str
    device: str | None = None  # where the operation starts a process: reserved while it runs
    id: str = field(default_factory=lambda: f"op-{uuid.uuid4().hex[:12]}")
    state: OpState = OpState.RUNNING
    step: str = "queued"  # one of its kind's stages (`engine/api/stages.py`)
    stage: str = "queued"  # the step as people read it, with its detail: "draining: 3 session(s) left"
    started: float = field(default_factory=time.time)
    result: OperationResult | None = None
    error: str | None = None
    writer_pid: int | None = None
    destination_pid: int | None = None

    def at(self, step: StrEnum, detail: str = "") -> None:
        """The operation reached `step` (one of its kind's stages); `detail` says more ("3 session(s) left")."""
        self.step, self.stage = step.value, f"{step.value}: {detail}" if detail else step.value

    def info(self) -> OperationInfo:
        """The operation as `/fleet/operations/{id}` reports it."""
        return OperationInfo(id=self.id, kind=self.kind, worker=self.worker_id, device=self.device, state=self.state,
                             step=self.step, stage=self.stage,
                             progress=1.0 if self.state is not OpState.RUNNING else progress(self.kind, self.step),
                             started=self.started, result=self.result, error=self.error, writer_pid=self.writer_pid,
                             destination_pid=self.destination_pid)
