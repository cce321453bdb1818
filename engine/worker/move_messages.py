"""The messages of a live session move (fleet/ops/session_move.py drives it; worker/session_mover.py answers),
pickled over the same pipe as `protocol`'s: stage 0 ReserveBlocks to the destination; stages 1..k SendBlocks
(pre-copy: the full blocks so far, the session decoding on; a message publishes at most `max_bytes`, the rest
follows) to the source and ReceiveBlocks to the destination; the final stage SendBlocks with `final` (the source
stops the session between two steps) and ReceiveBlocks with the session (the destination takes it); then EndMove to
both. Any side may answer MoveRefused instead."""

from dataclasses import dataclass

from fleetctl.engine.core.sequence import SessionState
from fleetctl.engine.worker.protocol import KVHandle

# controller -> worker


@dataclass(frozen=True)
class ReserveBlocks:
    """Destination: set `num_blocks` free blocks aside for a session on its way here."""

    move_id: str
    num_blocks: int


@dataclass(frozen=True)
class SendBlocks:
    """Source: publish the session's blocks from `first_block` on: the full ones, or with `final` every
    block that holds K/V, after taking the session out of the batch (its blocks kept), with its state."""

    move_id: str
    request_id: str
    first_block: int
    final: bool = False
    max_bytes: int | None = None  # a pre-copy stage: at most this many bytes (whole blocks, at least one)


@dataclass(frozen=True)
class ReceiveBlocks:
    """Destination: copy `handle`'s blocks into the reservation from `first_block` on; with `session`,
    then decode the session here (the move commits)."""

    move_id: str
    handle: KVHandle | None
    first_block: int
    session: SessionState | None = None


@dataclass(frozen=True)
class EndMove:
    """Both sides: the source frees the session (`committed`) or decodes it again; the destination frees a
    reservation it did not commit; both drop the move's buffers."""

    move_id: str
    committed: bool


# worker -> controller


@dataclass(frozen=True)
class BlocksReserved:
    move_id: str
    free_blocks: int


@dataclass(frozen=True)
class BlocksSent:
    """`handle` holds blocks first_block..first_block+num_blocks-1 (None when there were none to send);
    `session` and `stopped_at` (time.time()) come with the final stage; `more`: a pre-copy stage stopped at its
    `max_bytes` with full blocks left."""

    move_id: str
    handle: KVHandle | None
    first_block: int
    num_blocks: int
    seconds: float
    session: SessionState | None = None
    stopped_at: float | None = None
    more: bool = False


@dataclass(frozen=True)
class BlocksReceived:
    move_id: str
    nbytes: int
    seconds: float
    committed: bool
    free_blocks: int


@dataclass(frozen=True)
class MoveRefused:
    """This side cannot go on with the move (the session ended or was preempted, no room, the KV is
    unreadable); nothing of the move is left on it but what EndMove settles."""

    move_id: str
    reason: str
