"""The bodies of the `/fleet/*` calls that change the fleet: what a client sends to start an operation."""

from typing import Literal

from pydantic import BaseModel, Field

DEFAULT_HOLD_S = 300.0  # a checkpointed worker's sessions wait this long for a restore, then are recomputed on peers


class CheckpointBody(BaseModel):
    hold_s: float | None = Field(default=None, ge=0)  # None: the fleet's own (`serve`'s, DEFAULT_HOLD_S unless set)


class MigrateBody(BaseModel):
    to: str
    via: Literal["live", "checkpoint"] = "live"  # checkpoint: the source pauses, its state goes through disk


class MoveBody(BaseModel):
    to: str  # a worker id of the session's role


class RestoreBody(BaseModel):
    checkpoint: str
    device: str
    force: bool = False  # replay its sessions even where that is refused (see checkpoint_catalog)


class StartBody(BaseModel):
    role: str  # checked by the operation, which knows the fleet's layout
    device: str


class DrainBody(BaseModel):
    move: bool = False  # move its decoding sessions to peers live rather than wait for them to finish


class SwitchBody(BaseModel):
    role: str  # prefill or decode: the role it serves once switched


class StopBody(BaseModel):
    force: bool = False


class RebalanceBody(BaseModel):
    split: str  # "P:D", checked by the rebalancer
    apply: bool = False
    force: bool = False
    via: str | None = None  # switch (in place) or restart; default switch where the roles' weight formats agree
