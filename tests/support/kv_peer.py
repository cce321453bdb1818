"""A worker-like peer process for the cross-process KV handoff tests: a spawned child (as the fleet's workers
are) that owns one real `KVTransport` and, once asked, one `LLMEngine` on its device, and answers the calls of
the test, which plays the controller: it carries plain-data handles between peers, never tensors."""

import contextlib
import dataclasses
import hashlib
import multiprocessing as mp
import os
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.core.torch_devices import make_current
from fleetctl.engine.worker import protocol as m
from fleetctl.engine.worker.kv_transport import KVTransport

CALL_TIMEOUT_S = 120
# fp32 and batch-invariant numerics: a handed-off sequence's tokens equal a colocated engine's
SETTINGS = EngineSettings(dtype="float32", deterministic=True, num_kv_blocks=64)


def checksum(tensor: torch.Tensor) -> str:
    """Of the tensor's bytes, whatever its dtype and device."""
    return hashlib.sha256(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()).hexdigest()


def engine(model_dir: Path, device: str, prefill_only: bool = False) -> LLMEngine:
    return LLMEngine(EngineConfig(model_dir=model_dir, device=device, settings=SETTINGS, prefill_only=prefill_only))


class PeerSide:
    """What runs in the child: each public method is a call the parent may make."""

    def __init__(self, device: str, shm_dir: Path, fleet_pid: int) -> None:
        make_current(device)  # before any CUDA work, as a worker does
        self.device = torch.device(device)
        self.transport = KVTransport(shm_dir, fleet_pid=fleet_pid)
        self.engine: LLMEngine | None = None

    def publish(self, seed: int, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[m.KVHandle, str]:
        """A seeded random KV on this peer's device, published; its handle and checksum."""
        kv = torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(self.device)
        return self.transport.publish(kv), checksum(kv)  # from here on only the export keeps the buffer

    def fetch(self, handle: m.KVHandle) -> str:
        """The checksum of the fetched copy (dropped right after, as an adopting engine drops it)."""
        kv = self.transport.fetch(handle, self.device)
        assert kv.device == self.device
        return checksum(kv)

    def release(self, handle: m.KVHandle) -> None:
        self.transport.release(handle)

    def held(self) -> tuple[int, int]:
        """(exports this producer still keeps, bytes its device's allocator has handed out)."""
        if self.device.type != "cuda":
            return self.transport.cuda_ipc.held, 0
        torch.cuda.ipc_collect()  # frees the exports whose every IPC reference has been paid
        return self.transport.cuda_ipc.held, torch.cuda.memory_allocated(self.device)

    def prefill(self, model_dir: Path, prompts: list[str], params: SamplingParams) -> list[m.Adopt]:
        """A prefill-only engine prefills every prompt and publishes its KV: per prompt, the Adopt a controller
        sends a decode worker."""
        self.engine = engine(model_dir, str(self.device), prefill_only=True)
        seqs = [self.engine.add_request(prompt, params, request_id=f"r{i}") for i, prompt in enumerate(prompts)]
        while len(self.engine.scheduler.parked) < len(seqs):
            self.engine.step()
        return [m.Adopt(seq.request_id, seq.prompt_token_ids, seq.output_token_ids, params, seq.seed,
                        self._publish(seq.request_id)) for seq in seqs]

    def _publish(self, request_id: str) -> m.KVHandle:
        assert self.engine is not None
        first_block, kv = self.engine.export_kv(request_id)
        return dataclasses.replace(self.transport.publish(kv), first_block=first_block)

    def finish_handoff(self, handle: m.KVHandle, request_id: str) -> None:
        """The decode side adopted `request_id`: the prefill engine forgets it, its KV is released."""
        assert self.engine is not None
        self.engine.release(request_id)
        self.transport.release(handle)

    def decode(self, model_dir: Path, adopts: list[m.Adopt]) -> dict[str, list[int]]:
        """A decode engine adopts every handed-off sequence (fetching its KV, as a decode worker does) and
        decodes them to the end: every request's output tokens, its first (the prefill's) included."""
        self.engine = engine(model_dir, str(self.device))
        seqs = [self.engine.import_sequence(a.request_id, a.prompt_token_ids, a.output_token_ids, a.params, a.seed,
                                            self.transport.fetch(a.handle, self.device), a.handle.first_block)
                for a in adopts]
        while self.engine.has_unfinished():
            self.engine.step()
        return {seq.request_id: seq.output_token_ids for seq in seqs}


def serve(conn: Connection, device: str, shm_dir: Path, fleet_pid: int) -> None:
    """The child's loop: (method, args) in, (True, result) or (False, the exception) out, until None."""
    side = PeerSide(device, shm_dir, fleet_pid)
    while (call := conn.recv()) is not None:
        name, args = call
        try:
            conn.send((True, getattr(side, name)(*args)))
        except Exception as exc:
            exc.add_note(f"in the peer on {device}:\n{traceback.format_exc()}")
            conn.send((False, exc))


class Peer:
    """The parent's end: a spawned child on `device` whose buffers are named after this (the controller's) pid."""

    def __init__(self, device: str, shm_dir: Path) -> None:
        self.device = device
        context = mp.get_context("spawn")
        self._conn, child = context.Pipe()
        self.process = context.Process(target=serve, args=(child, device, shm_dir, os.getpid()), daemon=True)
        self.process.start()
        child.close()

    def call(self, name: str, *args: object) -> Any:
        """What `name` returned in the child; its exception, if it raised, is raised here."""
        self._conn.send((name, args))
        if not self._conn.poll(CALL_TIMEOUT_S):
            raise TimeoutError(f"the peer did not answer {name} within {CALL_TIMEOUT_S} s")
        ok, result = self._conn.recv()
        if not ok:
            raise result
        return result

    def close(self) -> None:
        with contextlib.suppress(OSError):  # a child that died has no pipe to tell
            self._conn.send(None)
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
