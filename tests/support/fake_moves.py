"""Live session moves for the fake workers (fake_workers.py), answering as worker/session_mover.py does. A
fake session is a token counter holding one KV block, so a move is the destination going on with the same
deterministic token stream from the tokens the source made: the pre-copy stages find no full block to copy;
the final one stops the session between two steps and publishes its block to shared memory with its state;
the destination checks that buffer, takes the session and decodes on. EndMove frees the source's copy (or,
called off, has it decode again) and a reservation the destination never committed. With
`Faults.refuse_moves` every fake refuses every move, as workers without room would."""

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fleetctl.engine.core.sequence import SessionState
from fleetctl.engine.worker import move_messages as mv
from fleetctl.engine.worker import protocol as m
from fleetctl.engine.worker.shm_files import buffer_path
from support.fake_checkpoints import Session

if TYPE_CHECKING:
    from support.fake_workers import FakeWorker

MoveMessage = mv.ReserveBlocks | mv.SendBlocks | mv.ReceiveBlocks | mv.EndMove


@dataclass
class Outgoing:
    request_id: str
    stopped: Session | None = None  # taken out of the batch by the final stage, its block kept
    buffer: Path | None = None


class FakeMoves:
    def __init__(self, worker: "FakeWorker") -> None:
        self.worker = worker
        self.reserved: set[str] = set()  # move ids with a block set aside here
        self.outgoing: dict[str, Outgoing] = {}

    @property
    def blocks_held(self) -> int:
        """Blocks reserved for sessions on their way here, and those of sessions stopped for a move away."""
        return len(self.reserved) + sum(1 for o in self.outgoing.values() if o.stopped is not None)

    def handle(self, msg: MoveMessage) -> None:
        if isinstance(msg, mv.EndMove):
            self._end(msg)
        elif self.worker.faults.refuse_moves:
            self._refuse(msg, "this fake refuses live moves")
        elif isinstance(msg, mv.ReserveBlocks):
            self._reserve(msg)
        elif isinstance(msg, mv.SendBlocks):
            self._send_blocks(msg)
        else:
            self._receive(msg)

    def release_all(self) -> None:
        """The worker is exiting: drop every buffer it published for a move."""
        for outgoing in self.outgoing.values():
            self._drop_buffer(outgoing)

    def _refuse(self, msg: MoveMessage, reason: str) -> None:
        self.worker.send(mv.MoveRefused(msg.move_id, reason))

    # ---- destination ---------------------------------------------------------------------------

    def _reserve(self, msg: mv.ReserveBlocks) -> None:
        if self.worker.free_blocks < 1:
            self._refuse(msg, "out of KV blocks")
            return
        self.reserved.add(msg.move_id)
        self.worker.send(mv.BlocksReserved(msg.move_id, self.worker.free_blocks))

    def _receive(self, msg: mv.ReceiveBlocks) -> None:
        if msg.move_id not in self.reserved:
            self._refuse(msg, "no blocks reserved for this move")
            return
        if msg.handle is not None and not Path(msg.handle.location).exists():
            self._refuse(msg, "the session's KV is unreadable")
            return
        if msg.session is not None:
            state = msg.session
            self.reserved.discard(msg.move_id)
            run = m.RunRequest(state.request_id, state.prompt_token_ids, state.params, state.seed,
                               list(state.output_token_ids))
            self.worker.sessions[state.request_id] = Session(run, list(state.output_token_ids), prefilled=True)
        nbytes = msg.handle.nbytes if msg.handle is not None else 0
        self.worker.send(mv.BlocksReceived(msg.move_id, nbytes, 0.0, msg.session is not None, self.worker.free_blocks))

    # ---- source --------------------------------------------------------------------------------

    def _send_blocks(self, msg: mv.SendBlocks) -> None:
        worker = self.worker
        outgoing = self.outgoing.setdefault(msg.move_id, Outgoing(msg.request_id))
        self._drop_buffer(outgoing)  # the destination has copied the previous stage
        session = worker.sessions.get(msg.request_id)
        if session is None:
            self._refuse(msg, f"{msg.request_id} is not decoding here")
            return
        if not msg.final:  # its one block is not full yet: nothing to pre-copy
            worker.send(mv.BlocksSent(msg.move_id, None, msg.first_block, 0, 0.0))
            return
        del worker.sessions[msg.request_id]
        outgoing.stopped = session
        handle = None
        if msg.first_block == 0:
            outgoing.buffer = buffer_path(worker.shm_dir, os.getpid(), worker.pid, msg.move_id)
            outgoing.buffer.write_bytes(b"kv")
            handle = m.KVHandle(msg.request_id, m.HandleKind.SHM, (1,), "float32", 4, str(outgoing.buffer))
        state = SessionState(msg.request_id, list(session.msg.prompt_token_ids), list(session.output),
                             session.msg.params, session.msg.seed)
        worker.send(mv.BlocksSent(msg.move_id, handle, msg.first_block, 1 if handle else 0, 0.0, state, time.time()))

    def _end(self, msg: mv.EndMove) -> None:
        worker = self.worker
        if msg.move_id in self.reserved:  # never committed here
            self.reserved.discard(msg.move_id)
            worker.send(m.Capacity(worker.spec.worker_id, worker.free_blocks))
        outgoing = self.outgoing.pop(msg.move_id, None)
        if outgoing is None:
            return
        self._drop_buffer(outgoing)
        if msg.committed:
            worker.send(m.Capacity(worker.spec.worker_id, worker.free_blocks))
        elif outgoing.stopped is not None:  # called off after the final stage: it decodes here again
            worker.sessions[outgoing.request_id] = outgoing.stopped

    @staticmethod
    def _drop_buffer(outgoing: Outgoing) -> None:
        if outgoing.buffer is not None:
            outgoing.buffer.unlink(missing_ok=True)
            outgoing.buffer = None
