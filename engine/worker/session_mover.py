"""A worker's side of live session moves (the messages are described in `move_messages.py`, the controller's
side in `fleet/session_move.py`). Every message is answered, and an error here refuses the move
(`MoveRefused`) rather than dropping the session: it decodes on where it is until EndMove settles it.

The source publishes blocks through the handoff transport between two steps, so its other sessions
(and, until the final stage, this one) keep decoding; it keeps each stage's buffer until the next
stage or the end, since the controller asks for the next stage only once the destination has copied it."""

import time
from collections.abc import Callable
from dataclasses import dataclass

from fleetctl.engine.core.faults import fault_point
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.session_transfer import SessionTransfer, TransferRefused
from fleetctl.engine.worker import move_messages as mv
from fleetctl.engine.worker import protocol as m
from fleetctl.engine.worker.kv_transport import KVTransport, timed_fetch


@dataclass
class Outgoing:
    request_id: str
    preemptions: int  # the engine's count when the move began: any preemption calls it off
    handle: m.KVHandle | None = None
    stopped: bool = False


class SessionMover:
    def __init__(self, engine: LLMEngine, transport: KVTransport, send: Callable[[object], None],
                 capacity: Callable[[], None]) -> None:
        self.engine = engine
        self.transfer = SessionTransfer(engine)
        self.transport = transport
        self.send = send
        self.capacity = capacity  # says how many blocks are free now
        self.outgoing: dict[str, Outgoing] = {}
        self.incoming: dict[str, list[int]] = {}  # move id -> reserved blocks

    def handle(self, msg: mv.ReserveBlocks | mv.SendBlocks | mv.ReceiveBlocks | mv.EndMove) -> None:
        try:
            match msg:
                case mv.ReserveBlocks():
                    self._reserve(msg)
                case mv.SendBlocks():
                    self._send_blocks(msg)
                case mv.ReceiveBlocks():
                    self._receive(msg)
                case mv.EndMove():
                    self._end(msg)
        except Exception as exc:  # the session decodes on where it is; the controller calls the move off
            self.send(mv.MoveRefused(msg.move_id, f"{type(exc).__name__}: {exc}"))

    def release_all(self) -> None:
        """The worker is exiting: drop every buffer it published for a move."""
        for outgoing in self.outgoing.values():
            self._drop_buffer(outgoing)

    # ---- destination ---------------------------------------------------------------------------

    def _reserve(self, msg: mv.ReserveBlocks) -> None:
        fault_point("move-reserve", msg.move_id)
        self.incoming[msg.move_id] = self.transfer.reserve(msg.num_blocks)
        self.send(mv.BlocksReserved(msg.move_id, self.engine.kv_cache.allocator.num_free))

    def _receive(self, msg: mv.ReceiveBlocks) -> None:
        reserved = self.incoming[msg.move_id]
        nbytes, seconds = 0, 0.0
        if msg.handle is not None:
            kv, seconds = timed_fetch(self.transport, msg.handle, self.engine.device)
            start = time.perf_counter()
            count = kv.shape[2]
            if msg.first_block + count > len(reserved):
                reserved = self.incoming[msg.move_id] = self.transfer.grow(reserved, msg.first_block + count)
            self.transfer.write(reserved, msg.first_block, kv)
            nbytes, seconds = msg.handle.nbytes, seconds + time.perf_counter() - start
        fault_point("move-receive", msg.move_id)  # copied, not committed
        if msg.session is not None:
            fault_point("move-commit", msg.move_id)
            self.transfer.attach(msg.session, self.incoming.pop(msg.move_id))
        free = self.engine.kv_cache.allocator.num_free
        self.send(mv.BlocksReceived(msg.move_id, nbytes, seconds, msg.session is not None, free))

    # ---- source --------------------------------------------------------------------------------

    def _send_blocks(self, msg: mv.SendBlocks) -> None:
        outgoing = self.outgoing.setdefault(msg.move_id, Outgoing(msg.request_id, self.transfer.preemptions()))
        self._drop_buffer(outgoing)  # the destination has copied the previous stage
        fault_point("move-send", msg.move_id)
        seq = self.transfer.running(msg.request_id)
        if self.transfer.preemptions() != outgoing.preemptions:
            raise TransferRefused("a preemption freed blocks while it moved")
        start = time.perf_counter()
        session, stopped_at = None, None
        if msg.final:
            fault_point("move-stop", msg.move_id)
            session, last = self.transfer.stop(seq)
            outgoing.stopped, stopped_at = True, time.time()
        else:
            last = self.transfer.final_blocks(seq)
        first = self.transfer.first_to_send(seq, msg.first_block)
        count = max(0, last - first)
        more = msg.max_bytes is not None and count > (cap := max(1, msg.max_bytes // self.transfer.block_bytes()))
        if more:  # the rest in the next stage: the steps of every other session go on between the two
            count = cap
        if count:
            outgoing.handle = self.transport.publish(self.transfer.read(seq, first, first + count))
        self.send(mv.BlocksSent(msg.move_id, outgoing.handle, first, count, time.perf_counter() - start,
                               session, stopped_at, more))
        if msg.final:
            fault_point("move-handed-over", msg.move_id)  # the final stage sent, the destination not yet told

    def _end(self, msg: mv.EndMove) -> None:
        reserved = self.incoming.pop(msg.move_id, None)
        if reserved is not None:  # never committed here
            self.transfer.free(reserved)
            self.capacity()
        outgoing = self.outgoing.pop(msg.move_id, None)
        if outgoing is None:
            return
        self._drop_buffer(outgoing)
        if msg.committed:
            self.engine.release(outgoing.request_id)
            self.capacity()
        elif outgoing.stopped:
            self.transfer.restart(outgoing.request_id)

    def _drop_buffer(self, outgoing: Outgoing) -> None:
        if outgoing.handle is not None:
            self.transport.release(outgoing.handle)
            outgoing.handle = None
