"""The live session moves under way (`session_move`): each move's record, found by its id and by its
request's. The operation runner asks it whether a worker is idle (no move involves it); the moves
register and settle here."""

import asyncio
from dataclasses import dataclass, field

from fleetctl.engine.api.operation_results import MoveStageDone
from fleetctl.engine.fleet.request import TrackedRequest
from fleetctl.engine.worker import protocol as m


@dataclass
class SessionMove:
    move_id: str
    req: TrackedRequest
    source: str
    dest: str
    stages: list[MoveStageDone] = field(default_factory=list)
    stopped_at: float | None = None  # the source took the session out of its batch (time.time())
    final_sent: bool = False
    final_outlives_source: bool = False  # the final stage's KV is in shared memory (or there was none)
    committed: bool = False  # the stream follows the session on the destination
    taken: bool = False  # the destination said it has the session
    last_source_token: float | None = None
    first_dest_token: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    waiting: tuple[str, asyncio.Future] | None = None  # the worker asked, and its answer
    handle: m.KVHandle | None = None  # the latest stage's buffer: the destination may still read it

    def add_stage(self, name: str, blocks: int, nbytes: int, seconds: float) -> None:
        self.stages.append(MoveStageDone(stage=name, blocks=blocks, bytes=nbytes, seconds=round(seconds, 5)))


class MovesInFlight:
    def __init__(self) -> None:
        self.by_id: dict[str, SessionMove] = {}  # move id -> move in progress
        self.by_request: dict[str, str] = {}  # request id -> its move's id

    def add(self, move: SessionMove) -> None:
        self.by_id[move.move_id], self.by_request[move.req.request_id] = move, move.move_id

    def remove(self, move: SessionMove) -> None:
        del self.by_id[move.move_id]
        if self.by_request.get(move.req.request_id) == move.move_id:
            del self.by_request[move.req.request_id]

    def involving(self, worker_id: str) -> int:
        """Moves to or from `worker_id`."""
        return sum(1 for move in self.by_id.values() if worker_id in (move.source, move.dest))

    def buffers(self) -> set[str]:
        """Where the moves under way keep KV a destination may still read (not to be swept)."""
        return {move.handle.location for move in self.by_id.values() if move.handle is not None}
