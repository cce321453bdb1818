"""A long operation as a client follows it (`/fleet/operations/{id}`, and the 202 body of every operation
started): its kind and state, where it is (`stage`, `progress` from its kind's stages), and when it ends its
result or its error; `describe` says any operation, done or not, in one sentence for people (the CLI prints it,
the console's dialogs show it)."""

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from fleetctl.engine.api.operation_results import OperationResult


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


class OperationInfo(BaseModel):
    """`/fleet/operations/{id}`, and the 202 body of every operation started."""

    model_config = ConfigDict(frozen=True)

    id: str
    kind: OpKind
    worker: str
    device: str | None
    state: OpState
    step: str  # one of its kind's stages (STAGES)
    stage: str  # the step with its detail, for people
    progress: float | None  # how far through its kind's stages (1.0 once it ended)
    started: float
    result: OperationResult | None
    error: str | None
    writer_pid: int | None
    destination_pid: int | None

    @model_validator(mode="before")
    @classmethod
    def _result_of_its_kind(cls, data: Any) -> Any:
        """Parsed JSON: the result's model is the operation's kind's (and for a migration, its mode's)."""
        if isinstance(data, dict) and isinstance(data.get("result"), dict):
            return data | {"result": data["result"] | {"kind": data.get("kind")}}
        return data


def describe(op: OperationInfo) -> str:
    """One sentence for people: what a done operation did, why one failed or was called off, or where one
    still running is."""
    if op.state is OpState.FAILED:
        failed = f"{op.kind.value} of {op.worker} failed"
        error = op.error or "no reason given"  # a checkpoint's own step failing says it already (not twice)
        return error if error.startswith(failed) else f"{failed}: {error}"
    if op.state is OpState.CANCELLED:
        return f"{op.kind.value} of {op.worker} called off: {op.error}"
    if op.state is OpState.RUNNING or op.result is None:
        return f"{op.kind.value} of {op.worker}: {op.stage}"
    return op.result.describe()
