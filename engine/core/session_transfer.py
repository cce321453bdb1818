"""One engine's side of a live session move (the worker's session mover drives it): the source reads a
running sequence's blocks while it keeps decoding, then stops it between two steps; the destination
reserves blocks, writes what arrives into them and finally takes the sequence. Either side can call its
part off: the source schedules the sequence again, the destination frees what it reserved.

Only positions below `num_cached_tokens` are read: their K/V is final (a block is written up to the
sequence's last computed token and never again), so a block copied once stays valid while it decodes on.
A preemption frees and recomputes a sequence's blocks, so any preemption during a move calls it off.
Blocks a KV window dropped are not sent; the destination drops the places it reserved for them on `attach`.
With windowed layers kept apart, the destination gives window slots to the blocks it writes that the
sequence's window may still cover, held by the reservation until `attach` hands them to the sequence."""

import torch

from fleetctl.engine.core.block_allocator import OutOfBlocks, blocks_for
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import Sequence, SequenceStatus, SessionState
from fleetctl.errors import FleetctlError


class TransferRefused(FleetctlError):
    """The sequence cannot be moved (now): it ended, was preempted, or does not fit."""


class SessionTransfer:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.block_size = engine.kv_cache.spec.block_size

    # ---- source ------------------------------------------------------------------------------

    def running(self, request_id: str) -> Sequence:
        seq = self.engine.sequence(request_id)
        if seq is None or seq.status is not SequenceStatus.RUNNING or not seq.output_token_ids:
            raise TransferRefused(f"{request_id} is not decoding here")
        return seq

    def preemptions(self) -> int:
        return self.engine.scheduler.num_preemptions

    def final_blocks(self, seq: Sequence) -> int:
        """Blocks whose K/V will not change again: the full ones."""
        return seq.num_cached_tokens // self.block_size

    def block_bytes(self) -> int:
        """Bytes one block of the pool holds (every layer's K and V)."""
        return self.engine.kv_cache.spec.bytes_per_block

    def first_to_send(self, seq: Sequence, first: int) -> int:
        """`first`, or the first block `seq` has not dropped (kv_window) when that is later."""
        return max(first, seq.num_dropped_blocks)

    def read(self, seq: Sequence, first: int, last: int) -> torch.Tensor:
        """Blocks first..last-1 of `seq`: [layers, 2, last - first, block_size, Hkv, d]."""
        return self.engine.kv_cache.read_blocks(seq.block_table[first:last])

    def stop(self, seq: Sequence) -> tuple[SessionState, int]:
        """Take `seq` out of the batch, its blocks kept; returns its state and how many blocks hold its K/V."""
        self.engine.scheduler.park(seq)
        state = SessionState(seq.request_id, list(seq.prompt_token_ids), list(seq.output_token_ids), seq.params,
                             seq.seed, seq.session)
        return state, blocks_for(seq.num_cached_tokens, self.block_size)

    def restart(self, request_id: str) -> None:
        """The move was called off after `stop`: decode the sequence here again."""
        seq = self.engine.scheduler.parked.get(request_id)
        if seq is not None:
            self.engine.scheduler.unpark(seq)

    # ---- destination -------------------------------------------------------------------------

    def reserve(self, count: int) -> list[int]:
        allocator = self.engine.kv_cache.allocator
        if not allocator.can_allocate(count):
            raise TransferRefused(f"needs {count} KV blocks, {allocator.num_free} free")
        return allocator.allocate(count)

    def write(self, reserved: list[int], first: int, kv: torch.Tensor) -> None:
        """kv: [layers, 2, n, block_size, Hkv, d] into the sequence's blocks first..first+n-1, `reserved`'s."""
        end = first + kv.shape[2]
        windows = self.engine.scheduler.windows
        if windows is not None:
            try:
                windows.hold_received(reserved, end)
            except OutOfBlocks as exc:
                raise TransferRefused(str(exc)) from None
        self.engine.kv_cache.write_blocks(reserved[first:end], kv)

    def grow(self, reserved: list[int], count: int) -> list[int]:
        """`reserved` extended to `count` blocks (the sequence outgrew the reservation while it moved)."""
        return reserved + self.reserve(count - len(reserved)) if count > len(reserved) else reserved

    def attach(self, state: SessionState, reserved: list[int]) -> Sequence:
        """Take the sequence: its K/V is in the first blocks of `reserved`; the rest are freed."""
        seq = Sequence(list(state.prompt_token_ids), state.params, request_id=state.request_id,
                       output_token_ids=list(state.output_token_ids), seed=state.seed, session=state.session)
        used = blocks_for(seq.num_tokens - 1, self.block_size)
        self.free(reserved[used:])
        try:
            self.engine.attach_moved(seq, reserved[:used])
        except Exception:
            self.free(reserved[:used])
            raise
        return seq

    def free(self, blocks: list[int]) -> None:
        """Free reserved blocks, and the window slots they hold."""
        if blocks:
            allocator = self.engine.kv_cache.allocator
            allocator.free(blocks, windowed=allocator.window.slotted(blocks) if allocator.window else [])
