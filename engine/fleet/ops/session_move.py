"""Live session moves, the controller's side: a decoding session goes from one running worker to another of
its role while it keeps decoding (the messages are described in `worker/move_messages.py`).

Stage 0 reserves blocks on the destination; stages 1..k copy the source's full blocks (the first stage all
of them, each later one those filled meanwhile; each in pieces of at most PRECOPY_STAGE_BYTES, so the workers step
between them) until a stage has at most one block to copy; the final
stage stops the session on the source between two steps, copies the rest (the last partial block) with
the session's state, and the destination takes it. The stream is re-pointed the moment the destination
says it has the session, before any token of it can arrive from there; then the source frees its copy.

Commit-or-abort: until the destination has the session, any refusal, timeout or death calls the move off
and the session decodes on where it was (a source that stopped it decodes it again), or, if the source
died, is recomputed from its tokens like any other of its sessions. A source that dies after handing over
its final stage through shared memory (which outlives it) does not stop the commit. No token is repeated
or dropped: every token the source made before it stopped reached the controller before its final stage."""

import asyncio
import time
import uuid
from collections.abc import Callable

from fleetctl.domain import EventKind, WorkerRole, WorkerState
from fleetctl.engine.api.operation_results import MoveResult
from fleetctl.engine.api.operations import OpKind
from fleetctl.engine.api.stages import MoveStage
from fleetctl.engine.core.block_allocator import blocks_for
from fleetctl.engine.fleet import placement
from fleetctl.engine.fleet.errors import MoveFailed, OperationRefused
from fleetctl.engine.fleet.ops.moves_in_flight import SessionMove
from fleetctl.engine.fleet.ops.record import Operation
from fleetctl.engine.fleet.ops.runner import OperationRunner
from fleetctl.engine.fleet.request import RequestMove, RequestStage, TrackedRequest
from fleetctl.engine.worker import move_messages as mv
from fleetctl.engine.worker import protocol as m

MAX_PRECOPY_STAGES = 4
# A pre-copy stage publishes at most this much (the rest follows in the same round): the source publishes and the
# destination copies between two of their steps, so a stage's size is a pause for every session on either worker
# (a session of 2,048 float32 tokens of smollm2 is 94 MB: one stage of it stalled the others ~0.3 s).
PRECOPY_STAGE_BYTES = 16 << 20
RESERVE_SLACK_TOKENS = 32  # the session grows while it is copied
STAGE_TIMEOUT_S = 60.0
FIRST_TOKEN_TIMEOUT_S = 60.0

Reply = mv.BlocksReserved | mv.BlocksSent | mv.BlocksReceived | mv.MoveRefused


class SessionMoves:
    def __init__(self, runner: OperationRunner, recompute: Callable[[TrackedRequest, WorkerRole], None]) -> None:
        self.runner = runner
        self.state = runner.state
        self.host = runner.host
        self.recompute = recompute  # continue a request from its tokens on a worker of its role
        self.in_flight = runner.moves
        self._first_tokens: dict[str, SessionMove] = {}  # request id -> a committed move awaiting its first token
        # Copies from one source go one session at a time: moved together, their bulk copies interleaved in both
        # workers' message loops and a stopped session's final stage waited behind the others' pre-copies (8
        # sessions of 2,048 tokens: 2.2 s, 11x a normal gap). The sessions waiting here decode on meanwhile.
        self._copying: dict[str, asyncio.Lock] = {}

    # ---- the operation: POST /fleet/requests/{id}/move ------------------------------------------

    def move(self, request_id: str, to: str) -> Operation:
        req, source = self.check(request_id, to)
        op = Operation(OpKind.MOVE, source)

        async def run() -> MoveResult:
            return await self.move_session(req, source, to, op)

        return self.runner.launch(op, run(), exclusive=False)

    def check(self, request_id: str, to: str) -> tuple[TrackedRequest, str]:
        """The request and the worker it decodes on, when it may move to `to` now (4xx otherwise)."""
        req = self.state.requests.get(request_id)
        if req is None or req.done:
            raise OperationRefused(404, f"no request {request_id!r} in flight")
        dest = self.runner.known_worker(to)
        source = movable_from(req)
        if source is None:
            raise OperationRefused(409, f"{request_id} is {req.stage.value}, not decoding: only a decoding session "
                                        f"moves")
        if source == to:
            raise OperationRefused(409, f"{request_id} already decodes on {to}")
        role = self.state.views[source].role
        if dest.role is not role:
            raise OperationRefused(409, f"{to} is a {dest.role.value} worker; {request_id} decodes on a {role.value} "
                                        f"worker and moves only to another one")
        if dest.state is not WorkerState.RUNNING:
            raise OperationRefused(409, f"{to} is {dest.state.value}, not running")
        if request_id in self.in_flight.by_request:
            raise OperationRefused(409, f"{request_id} is moving already")
        for wid in (source, to):
            busy = self.runner.busy_with(wid)
            if busy is not None and busy.kind is not OpKind.DRAIN:
                raise OperationRefused(409, f"another operation is running on {wid} ({busy.kind.value} {busy.id})")
        return req, source

    # ---- the protocol --------------------------------------------------------------------------

    async def move_session(self, req: TrackedRequest, source: str, dest: str,
                           op: Operation | None = None) -> MoveResult:
        """Move `req` from `source` to `dest` (showing its stages in `op`, if given); returns the move's
        stages, bytes and downtime, or raises MoveFailed once the session decodes on (or is recomputed) elsewhere."""
        move = SessionMove(f"{req.request_id}~{uuid.uuid4().hex[:8]}", req, source, dest)
        self.in_flight.add(move)
        try:
            _at(op, MoveStage.RESERVING_BLOCKS)
            start = time.perf_counter()
            tokens = len(req.prompt_token_ids) + len(req.output_token_ids)
            dest_kv = self.state.views[dest].kv
            reserve = blocks_for(tokens + RESERVE_SLACK_TOKENS, dest_kv.block_size)
            dest_kv.reserve(move.move_id, reserve)  # until the destination answers (its reports then count them)
            await self._ask(move, dest, mv.ReserveBlocks(move.move_id, reserve))
            move.add_stage("reserve", reserve, 0, time.perf_counter() - start)
            async with self._copying.setdefault(source, asyncio.Lock()):
                first, stage, copied = 0, 1, 0  # copied: blocks sent in this pre-copy round so far
                while stage <= MAX_PRECOPY_STAGES:
                    _at(op, MoveStage.PRE_COPY, str(stage))
                    sent, received, seconds = await self._copy(move, first, final=False)
                    move.add_stage(f"pre-copy {stage}", sent.num_blocks, received.nbytes if received else 0, seconds)
                    first = sent.first_block + sent.num_blocks  # the source skips blocks its KV window dropped
                    copied += sent.num_blocks
                    if sent.more:
                        continue  # the round goes on in pieces of PRECOPY_STAGE_BYTES
                    if copied <= 1:
                        break  # what is left fits the final stage
                    stage, copied = stage + 1, 0
                _at(op, MoveStage.FINAL_STAGE)
                sent, received, seconds = await self._copy(move, first, final=True)
                move.add_stage("final", sent.num_blocks, received.nbytes if received else 0, seconds)
            if not move.committed:
                raise MoveFailed(f"{req.request_id} ended or went on elsewhere before {dest} took it")
        except MoveFailed as exc:
            self._settle(move)
            self._orphaned(move)
            self._record(move, str(exc))
            raise MoveFailed(f"move of {req.request_id} to {dest} called off: {exc}; {self._where(move)}") from None
        self._settle(move)
        _at(op, MoveStage.FIRST_TOKEN)
        downtime = await self._downtime(move)
        resumed = move.first_dest_token.result() if move.first_dest_token.done() else None
        result = MoveResult(request=req.request_id, from_=source, to=dest, stages=move.stages,
                            bytes=sum(s.bytes for s in move.stages), downtime_s=downtime, resumed_at=resumed)
        self._record(move, None, downtime)
        return result

    async def _copy(self, move: SessionMove, first: int,
                    final: bool) -> tuple[mv.BlocksSent, mv.BlocksReceived | None, float]:
        start = time.perf_counter()
        limit = None if final else PRECOPY_STAGE_BYTES
        sent = await self._ask(move, move.source, mv.SendBlocks(move.move_id, move.req.request_id, first, final, limit))
        assert isinstance(sent, mv.BlocksSent)
        if final:
            assert sent.session is not None
            if sent.session.output_token_ids != move.req.output_token_ids and not move.req.done:
                raise MoveFailed(f"{move.source} stopped it at {len(sent.session.output_token_ids)} tokens, the "
                                 f"stream has {len(move.req.output_token_ids)}")
        received = None
        if sent.handle is not None or final:
            received = await self._ask(move, move.dest, mv.ReceiveBlocks(move.move_id, sent.handle, sent.first_block,
                                                                         sent.session if final else None))
            assert isinstance(received, mv.BlocksReceived)
        return sent, received, time.perf_counter() - start

    async def _ask(self, move: SessionMove, wid: str, msg: object) -> Reply:
        view, link = self.state.views.get(wid), self.state.links.get(wid)
        if view is None or link is None or view.gone or link.closed:
            raise MoveFailed(f"{wid} is gone")
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        move.waiting = (wid, future)
        link.send(msg)
        try:
            reply = await asyncio.wait_for(future, STAGE_TIMEOUT_S)
        except TimeoutError:
            raise MoveFailed(f"{wid} did not answer within {STAGE_TIMEOUT_S:g} s") from None
        finally:
            move.waiting = None
        if isinstance(reply, mv.MoveRefused):
            raise MoveFailed(f"{wid} refused: {reply.reason}")
        return reply

    @staticmethod
    def _unlink(move: SessionMove) -> None:
        """Remove the move's shared-memory buffer (a device buffer is its producer's: it drops it with the
        next stage or EndMove)."""
        if move.handle is not None:
            move.handle.unlink()
            move.handle = None

    def _settle(self, move: SessionMove) -> None:
        """Tell both sides how the move ended; nothing of it is left behind."""
        dest = self.state.views.get(move.dest)
        if dest is not None:  # a reservation it never answered (it refused, timed out or exited)
            dest.kv.settled(move.move_id)
        for wid in (move.source, move.dest):
            link, view = self.state.links.get(wid), self.state.views.get(wid)
            if link is not None and view is not None and not view.gone:
                link.send(mv.EndMove(move.move_id, move.committed))
        self._unlink(move)
        self.in_flight.remove(move)
        self.host.routing_changed()

    def _orphaned(self, move: SessionMove) -> None:
        """The stream was re-pointed to a destination that then refused the session (its source had died):
        recomputed from its tokens. A destination that died has its sessions recomputed by recovery."""
        if move.committed and not move.taken and not move.req.done and not self.state.views[move.dest].gone:
            placement.release(move.req, self.state.views[move.dest])
            self.recompute(move.req, self.state.views[move.dest].role)

    async def _downtime(self, move: SessionMove) -> float | None:
        """Last token from the source to the first from the destination, as the controller saw them."""
        deadline = time.monotonic() + FIRST_TOKEN_TIMEOUT_S
        try:
            while not move.first_dest_token.done() and not move.req.done and time.monotonic() < deadline:
                await asyncio.wait([move.first_dest_token], timeout=0.05)
        finally:
            self._first_tokens.pop(move.req.request_id, None)
        if not move.first_dest_token.done():  # it ended before the destination decoded it
            return None
        first = move.first_dest_token.result()
        before = move.last_source_token or move.stopped_at or first
        downtime = first - before
        move.req.moves.append(RequestMove(move.source, move.dest, before, first, sum(s.bytes for s in move.stages)))
        self.state.stats.migration_downtime.observe(downtime)
        return round(downtime, 5)

    def _where(self, move: SessionMove) -> str:
        req = move.req
        if req.done:
            return "it had ended"
        holder = req.holder()
        if holder == move.source:
            return f"it decodes on {move.source}"
        return f"it goes on {'on ' + holder if holder else 'from its tokens'} (recomputed)"

    def _record(self, move: SessionMove, error: str | None, downtime: float | None = None) -> None:
        details = {"request": move.req.request_id, "from": move.source, "to": move.dest,
                   "stages": [s.model_dump() for s in move.stages], "bytes": sum(s.bytes for s in move.stages),
                   "downtime_s": downtime}
        self.state.record_event(EventKind.MOVE, move.source, details | ({"error": error} if error else {}))

    # ---- messages and exits (event loop) ----------------------------------------------------------

    def on_message(self, wid: str, msg: Reply) -> None:
        move = self.in_flight.by_id.get(msg.move_id)
        if move is None:
            return
        if isinstance(msg, mv.BlocksReserved):
            self.state.views[wid].kv.settled(move.move_id, msg.free_blocks)
        if isinstance(msg, mv.BlocksSent):  # noted now: the source's exit may be handled before `_copy` resumes
            self._sent(move, msg)
        if isinstance(msg, mv.BlocksReceived) and msg.committed:
            self.state.views[wid].kv.reported(msg.free_blocks)
            move.taken = True
            self._commit(move)
        if move.waiting is not None and move.waiting[0] == wid and not move.waiting[1].done():
            move.waiting[1].set_result(msg)

    def _sent(self, move: SessionMove, sent: mv.BlocksSent) -> None:
        if sent.handle is not None:  # the destination copied the previous stage's buffer (if any) before this
            self._unlink(move)
            move.handle = sent.handle
        if sent.session is not None:
            move.stopped_at, move.final_sent = sent.stopped_at, True
            move.final_outlives_source = sent.handle is None or sent.handle.outlives_producer

    def _commit(self, move: SessionMove) -> None:
        """The destination decodes the session from its next step: its stream follows it there now."""
        req, views = move.req, self.state.views
        if move.committed:
            return
        if req.done or req.holder() != move.source:  # ended, or recomputed elsewhere meanwhile
            self.state.send(move.dest, m.Abort(req.request_id))
            return
        placement.move(req, views[move.source], views[move.dest])
        move.committed = True
        self._first_tokens[req.request_id] = move

    def on_step(self, wid: str, report: m.StepReport) -> None:
        """Token times of the sessions moving (their downtime)."""
        if not self.in_flight.by_request and not self._first_tokens:
            return
        now = time.time()
        for event in report.tokens:
            move_id = self.in_flight.by_request.get(event.request_id)
            if move_id is not None and self.in_flight.by_id[move_id].source == wid:
                self.in_flight.by_id[move_id].last_source_token = now
            waiting = self._first_tokens.get(event.request_id)
            if waiting is not None and waiting.dest == wid and not waiting.first_dest_token.done():
                waiting.first_dest_token.set_result(now)

    def on_worker_exit(self, wid: str) -> None:
        """Before recovery: a move waiting on `wid` is called off; a source that died after its final stage
        reached shared memory leaves the session to the destination (not to a recompute)."""
        for move in list(self.in_flight.by_id.values()):
            if move.source == wid and move.final_sent and move.final_outlives_source:
                self._commit(move)  # re-pointed now, so recovery leaves it; a refusal recomputes it
            if move.waiting is not None and move.waiting[0] == wid and not move.waiting[1].done():
                move.waiting[1].set_result(mv.MoveRefused(move.move_id, f"{wid} exited"))


def movable_from(req: TrackedRequest) -> str | None:
    """The worker a session decodes on, if it decodes (a mixed worker's session once it has a token)."""
    if req.stage is RequestStage.DECODE and req.decode_worker is not None:
        return req.decode_worker
    if req.stage is RequestStage.PREFILL and req.output_token_ids and req.decode_worker is None:
        return req.prefill_worker  # on a mixed worker (a prefill worker's session is HANDOFF by now)
    return None


def _at(op: Operation | None, stage: MoveStage, detail: str = "") -> None:
    if op is not None:
        op.at(stage, detail)
