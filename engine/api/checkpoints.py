"""`/fleet/checkpoints`: the checkpoints on this machine, each verified (valid, or why not)."""

from fleetctl.engine.api.open_model import OpenModel


class CheckpointEntry(OpenModel):
    checkpoint: str
    name: str
    used_at: str | None
    valid: bool
    error: str | None = None  # an invalid one: why
    worker: str | None = None
    role: str | None = None
    sessions: int | None = None
    created: str | None = None
    bytes: int | None = None


class CheckpointList(OpenModel):
    checkpoints: list[CheckpointEntry]
