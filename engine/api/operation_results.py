"""What each kind of operation returns when it is done: frozen pydantic models the operations build and
`/fleet/operations/{id}` reports as its `result` (the `--json` shapes of §2: fields are added, never
renamed). Each knows the kind of operation it is the result of (`kind`, not in its JSON: the operation
names it, and `operations.OperationInfo` hands it down to tell the results apart when parsed) and says
itself in one sentence for people (`describe`). Part of the wire contract: the server and the
console use them."""

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag


class _Result(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, serialize_by_alias=True)

    def describe(self) -> str:
        raise NotImplementedError


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


class CheckpointResult(_Result):
    kind: Literal["checkpoint"] = Field(default="checkpoint", exclude=True)
    worker: str
    path: str  # the checkpoint's directory (`checkpoint --json`)
    checkpoint: str  # the same, as restore and migrate name it
    sessions: int
    bytes: int
    seconds: float

    def describe(self) -> str:
        return (f"{self.worker}: {self.sessions} session(s) saved to {self.path}, {self.bytes:,} bytes in "
                f"{self.seconds:.3f} s")


class RestoreResult(_Result):
    """A restore, or a migration through a checkpoint (which adds `checkpoint_s`)."""

    kind: Literal["restore", "migrate"] = Field(default="restore", exclude=True)
    worker: str
    from_: str | None = Field(alias="from")  # the device it ran on before (None: another fleet's checkpoint)
    to: str
    mode: Literal["restored", "cold-start"]
    reason: str | None  # why a cold start: the compat field that differed
    sessions: int
    bytes: int
    downtime_s: float
    checkpoint: str
    restore_s: float
    checkpoint_s: float | None = Field(default=None, exclude_if=lambda s: s is None)  # a migration: its writing

    def describe(self) -> str:
        mode = self.mode + (f" ({self.reason})" if self.reason else "")
        return (f"{self.worker} {self.from_ or '-'} → {self.to}: {mode}; {self.sessions} session(s) moved, "
                f"{self.bytes:,} bytes, downtime {self.downtime_s:.3f} s")


class SessionMoved(_Result):
    request: str
    downtime_s: float | None
    resumed_at: float | None

    def describe(self) -> str:
        return f"{self.request}: downtime {_ms(self.downtime_s)}"


class LiveMigrateResult(_Result):
    kind: Literal["migrate"] = Field(default="migrate", exclude=True)
    worker: str
    from_: str = Field(alias="from")
    to: str
    mode: Literal["live"] = "live"
    reason: None = None
    sessions: int
    bytes: int
    downtime_s: float  # the longest session's
    checkpoint: None = None
    moves: list[SessionMoved]
    seconds: float

    def describe(self) -> str:
        return (f"{self.worker} {self.from_} → {self.to}: live; {self.sessions} session(s) moved, {self.bytes:,} "
                f"bytes, longest session downtime {_ms(self.downtime_s)}")


class MoveStageDone(_Result):
    stage: str
    blocks: int
    bytes: int
    seconds: float

    def describe(self) -> str:
        return f"{self.stage}: {self.blocks} block(s), {self.bytes:,} bytes in {self.seconds:.3f} s"


class MoveResult(_Result):
    kind: Literal["move"] = Field(default="move", exclude=True)
    request: str
    from_: str = Field(alias="from")
    to: str
    stages: list[MoveStageDone]
    bytes: int
    downtime_s: float | None  # None: it ended before the destination decoded it
    resumed_at: float | None

    def describe(self) -> str:
        return (f"{self.request}: {self.from_} → {self.to} live in {len(self.stages)} stage(s), {self.bytes:,} "
                f"bytes, downtime {_ms(self.downtime_s)}")


class StartResult(_Result):
    kind: Literal["start"] = Field(default="start", exclude=True)
    worker: str
    role: str
    device: str
    pid: int | None
    seconds: float
    load_s: float | None = None  # of which loading the model (the worker's own count)
    out_of_service_s: float = 0.0  # the device serving nothing: from the request until the worker is ready

    def describe(self) -> str:
        load = f", {self.load_s:.1f} s of it loading the model" if self.load_s is not None else ""
        return f"{self.worker} started on {self.device} (pid {self.pid}) in {self.seconds:.1f} s{load}"


class DrainResult(_Result):
    kind: Literal["drain"] = Field(default="drain", exclude=True)
    worker: str
    sessions_finished: int
    seconds: float
    sessions_moved: int | None = Field(default=None, exclude_if=lambda moved: moved is None)  # drain --move only

    def describe(self) -> str:
        moved = f", {self.sessions_moved} moved to peers" if self.sessions_moved else ""
        return (f"{self.worker} drained: {self.sessions_finished} session(s) finished{moved} in {self.seconds:.1f} s; "
                f"it takes no new work (`fleetctl resume {self.worker}` or `fleetctl stop {self.worker}`)")


class ResumeResult(_Result):
    kind: Literal["resume"] = Field(default="resume", exclude=True)
    worker: str
    cancelled_operation: str | None  # the drain (or stop) it called off

    def describe(self) -> str:
        called_off = f" (operation {self.cancelled_operation} called off)" if self.cancelled_operation else ""
        return f"{self.worker} takes new work again{called_off}"


class StopResult(_Result):
    kind: Literal["stop"] = Field(default="stop", exclude=True)
    worker: str
    sessions_finished: int
    sessions_moved: int
    seconds: float
    out_of_service_s: float = 0.0  # from taking no new work until its process is gone

    def describe(self) -> str:
        return (f"{self.worker} stopped: {self.sessions_finished} session(s) finished, {self.sessions_moved} moved "
                f"to peers, {self.seconds:.1f} s")


class RestartResult(_Result):
    kind: Literal["restart"] = Field(default="restart", exclude=True)
    worker: str
    device: str
    pid: int | None
    attempt: int
    backoff_s: float

    def describe(self) -> str:
        return (f"{self.worker} restarted on {self.device} (pid {self.pid}), attempt {self.attempt} after "
                f"{self.backoff_s:g} s")


class RoleChange(_Result):
    """One worker a rebalance changes the role of."""

    worker: str
    device: str
    from_: str = Field(alias="from")
    to: str
    sessions: int  # held when the rebalance was accepted

    def describe(self) -> str:
        return f"{self.worker} on {self.device}: {self.from_} → {self.to} ({self.sessions} session(s))"


class RoleChanged(RoleChange):
    """A role change done: the worker that replaced it and where its sessions went."""

    new_worker: str
    sessions_finished: int
    sessions_moved: int
    seconds: float

    def describe(self) -> str:
        return (f"{self.worker} on {self.device}: {self.from_} → {self.to} as {self.new_worker}; "
                f"{self.sessions_finished} session(s) finished, {self.sessions_moved} moved, {self.seconds:.1f} s")


class SwitchResult(_Result):
    """A worker changed role in place: the same process (`pid`) under a new id."""

    kind: Literal["switch"] = Field(default="switch", exclude=True)
    worker: str  # its new id
    was: str  # its id before
    from_: str = Field(alias="from")
    to: str
    pid: int | None
    sessions_finished: int
    sessions_moved: int
    switch_s: float  # the process re-laying itself (no model load)
    out_of_service_s: float  # from taking no new work to serving the new role
    seconds: float
    sessions_kept: int = 0  # held through the switch and continued by the same process (both roles decode)

    def describe(self) -> str:
        kept = f", {self.sessions_kept} kept through the switch" if self.sessions_kept else ""
        return (f"{self.was} is now {self.worker} ({self.from_} → {self.to}, the same process {self.pid}): "
                f"{self.sessions_moved} session(s) moved, {self.sessions_finished} finished in place{kept}; out of "
                f"service {self.out_of_service_s:.2f} s, of which the switch itself {self.switch_s:.2f} s")


class WorkerStart(_Result):
    """A worker a rebalance starts on a free device of the fleet's (a layout on more devices)."""

    role: str
    device: str

    def describe(self) -> str:
        return f"start a {self.role} worker on {self.device}"


class WorkerStop(_Result):
    """A worker a rebalance stops (a layout on fewer devices): its decoding sessions move live to peers first."""

    worker: str
    device: str
    role: str
    sessions: int  # held when the rebalance was accepted

    def describe(self) -> str:
        return f"stop {self.worker} on {self.device} ({self.sessions} session(s))"


class RebalanceResult(_Result):
    kind: Literal["rebalance"] = Field(default="rebalance", exclude=True)
    split: str
    from_: str = Field(alias="from")
    evacuation: str
    moves: list[RoleChanged]
    seconds: float
    via: str = "restart"  # switch (in place) or restart
    started: list[StartResult] = Field(default_factory=list)  # workers started on free devices, first
    stopped: list[StopResult] = Field(default_factory=list)  # workers stopped, last

    def describe(self) -> str:
        moved = sum(change.sessions_moved for change in self.moves) + sum(s.sessions_moved for s in self.stopped)
        finished = (sum(change.sessions_finished for change in self.moves)
                    + sum(s.sessions_finished for s in self.stopped))
        pool = "".join(f", {len(group)} {verb}" for group, verb in ((self.started, "started"),
                                                                     (self.stopped, "stopped")) if group)
        return (f"fleet {self.from_} → {self.split}: {len(self.moves)} worker(s) changed role ({self.evacuation}, "
                f"via {self.via}){pool}; {moved} session(s) moved, {finished} finished, {self.seconds:.1f} s")


def _tag(result: object) -> str:
    """Which model a result (parsed JSON or a model) is: its kind, and for a migration its mode."""
    fields = result if isinstance(result, dict) else vars(result)
    kind = str(fields.get("kind"))
    return f"{kind} {fields.get('mode') or ''}".strip() if kind == "migrate" else kind


OperationResult = Annotated[
    Annotated[CheckpointResult, Tag("checkpoint")] | Annotated[RestoreResult, Tag("restore")]
    | Annotated[RestoreResult, Tag("migrate restored")] | Annotated[RestoreResult, Tag("migrate cold-start")]
    | Annotated[LiveMigrateResult, Tag("migrate live")] | Annotated[MoveResult, Tag("move")]
    | Annotated[StartResult, Tag("start")] | Annotated[DrainResult, Tag("drain")]
    | Annotated[ResumeResult, Tag("resume")] | Annotated[StopResult, Tag("stop")]
    | Annotated[RestartResult, Tag("restart")] | Annotated[RebalanceResult, Tag("rebalance")]
    | Annotated[SwitchResult, Tag("switch")],
    Discriminator(_tag)]


class RebalancePreview(_Result):
    """A rebalance's dry run: the workers `rebalance --apply` would start, change the role of and stop, in order."""

    split: str
    current: str
    force: bool
    evacuation: str
    moves: list[RoleChange]
    via: str = "restart"  # switch (in place) or restart
    starts: list[WorkerStart] = Field(default_factory=list)
    stops: list[WorkerStop] = Field(default_factory=list)

    def describe(self) -> str:
        steps = [*self.starts, *self.moves, *self.stops]
        changes = "; ".join(step.describe() for step in steps) or "no worker changes role"
        return f"fleet {self.current} → {self.split} ({self.evacuation}, via {self.via}): {changes}"
