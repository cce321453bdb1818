"""The stages each kind of operation goes through, in order, declared once: the operations set them
(`Operation.at`), `/fleet/operations/{id}` reports the current one as `step` (and as the start of `stage`,
the text shown to people: "<step>: <detail>"), and a client computes progress from their order
(`progress`). A migration has two paths (live, or through a checkpoint), each with its own stages."""

from enum import StrEnum

from fleetctl.engine.api.operations import OpKind


class CheckpointStage(StrEnum):
    QUEUED = "queued"
    PAUSING = "pausing"
    WRITING = "writing"
    DONE = "done"


class RestoreStage(StrEnum):
    QUEUED = "queued"
    STARTING_DESTINATION = "starting destination"
    LOADING_MODEL = "loading model"
    RESTORING = "restoring"
    FIRST_STEP = "first step"
    DONE = "done"


class LiveMigrateStage(StrEnum):
    QUEUED = "queued"
    STARTING_DESTINATION = "starting destination"
    LOADING_MODEL = "loading model"
    MOVING_SESSIONS = "moving sessions"
    SWITCHING_OVER = "switching over"
    CALLING_OFF = "calling off"  # a session could not move: what reached the standby moves back
    DONE = "done"


class CheckpointMigrateStage(StrEnum):
    QUEUED = "queued"
    STARTING_DESTINATION = "starting destination"
    LOADING_MODEL = "loading model"
    PAUSING_SOURCE = "pausing source"
    WRITING = "writing"
    RESTORING = "restoring"
    FIRST_STEP = "first step"
    DONE = "done"


class MoveStage(StrEnum):
    QUEUED = "queued"
    RESERVING_BLOCKS = "reserving blocks"
    PRE_COPY = "pre-copy"
    FINAL_STAGE = "final stage"
    FIRST_TOKEN = "first token"
    DONE = "done"


class StartStage(StrEnum):
    QUEUED = "queued"
    STARTING_PROCESS = "starting process"
    LOADING_MODEL = "loading model"
    DONE = "done"


class DrainStage(StrEnum):
    QUEUED = "queued"
    MOVING_SESSIONS = "moving sessions"  # drain --move
    DRAINING = "draining"
    DONE = "done"


class ResumeStage(StrEnum):
    QUEUED = "queued"
    DONE = "done"


class StopStage(StrEnum):
    QUEUED = "queued"
    DRAINING = "draining"
    RECOMPUTING = "recomputing on peers"  # stop --force
    STOPPING = "stopping"
    DONE = "done"


class RestartStage(StrEnum):
    QUEUED = "queued"
    BACKING_OFF = "restarting"  # waiting out the backoff after a crash
    STARTING_PROCESS = "starting process"
    LOADING_MODEL = "loading model"
    DONE = "done"


class RebalanceStage(StrEnum):
    QUEUED = "queued"
    CHANGING_ROLES = "changing roles"  # the text names the step: "1/2 decode-1 on cpu:2 -> prefill: ..."
    DONE = "done"


class SwitchStage(StrEnum):
    QUEUED = "queued"
    MOVING_SESSIONS = "moving sessions"  # a decode worker's sessions move live to its peers
    DRAINING = "draining"  # what could not move, and a prefill worker's handoffs, finish in place
    SWITCHING = "switching"  # the process re-lays itself for the new role
    DONE = "done"


Stage = (CheckpointStage | RestoreStage | LiveMigrateStage | CheckpointMigrateStage | MoveStage | StartStage
         | DrainStage | ResumeStage | StopStage | RestartStage | RebalanceStage | SwitchStage)

# each kind's stages; a kind with several paths lists one enum per path
STAGES: dict[OpKind, tuple[type[StrEnum], ...]] = {
    OpKind.CHECKPOINT: (CheckpointStage,),
    OpKind.RESTORE: (RestoreStage,),
    OpKind.MIGRATE: (LiveMigrateStage, CheckpointMigrateStage),
    OpKind.MOVE: (MoveStage,),
    OpKind.START: (StartStage,),
    OpKind.DRAIN: (DrainStage,),
    OpKind.RESUME: (ResumeStage,),
    OpKind.STOP: (StopStage,),
    OpKind.RESTART: (RestartStage,),
    OpKind.REBALANCE: (RebalanceStage,),
    OpKind.SWITCH: (SwitchStage,),
}


def loading_model(kind: OpKind) -> StrEnum | None:
    """The kind's "loading model" stage, if it starts a process."""
    return next((stages("loading model") for stages in STAGES[kind] if "loading model" in set(stages)), None)


def progress(kind: OpKind, step: str) -> float | None:
    """How far an operation of `kind` at `step` is, in (0, 1]; None for a step its kind does not list (a
    path's stage that another path shares counts by the first path that lists it)."""
    for stages in STAGES[kind]:
        names = [stage.value for stage in stages]
        if step in names:
            return (names.index(step) + 1) / len(names)
    return None
