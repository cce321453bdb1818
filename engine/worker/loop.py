"""The worker's loop: one engine, one device, one role. It only loops and talks: messages in,
engine steps, reports out. The controller decides everything else."""

import os
import time
from multiprocessing.connection import Connection
from pathlib import Path

from fleetctl.engine.checkpoint.engine_io import current_compat, restore_engine, write_engine_checkpoint
from fleetctl.engine.checkpoint.format import CheckpointError, read_checkpoint
from fleetctl.engine.core.block_allocator import OutOfBlocks
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.prompt import PromptError
from fleetctl.engine.metrics.calibration import machine_lock
from fleetctl.engine.metrics.cost_model import CostModel
from fleetctl.engine.metrics.device_peaks import device_peaks
from fleetctl.engine.worker import protocol as m
from fleetctl.engine.worker.kv_transport import HandoffError, KVTransport, timed_fetch
from fleetctl.engine.worker.spec import WorkerSpec

IDLE_POLL_SECONDS = 0.02


class Worker:
    def __init__(self, spec: WorkerSpec, conn: Connection) -> None:
        self.spec = spec
        self.conn = conn
        with machine_lock(exclusive=False):  # no sibling calibrates while this worker loads
            self.engine = LLMEngine(spec.engine_config())
        self.transport = KVTransport()
        self.handles: dict[str, m.KVHandle] = {}
        self.running = True
        elem = self.engine.kv_cache.tensor.element_size()
        self.cost = CostModel(self.engine.model_config, weight_bytes=elem, kv_bytes=elem)
        self.peaks = device_peaks(self.engine.device, self.engine.dtype, self.cost.weight_bytes_per_step,
                                  spec.store_path)

    def run(self) -> None:
        allocator = self.engine.kv_cache.allocator
        self.compat = current_compat(self.engine, self.peaks.name)
        self.conn.send(m.WorkerReady(
            self.spec.worker_id, os.getpid(), allocator.num_blocks, self.engine.kv_cache.spec.block_size,
            self.engine.load_seconds, self.peaks.name, self.peaks.peak_flops, self.peaks.peak_bytes_per_s,
        ))
        stepped = False
        while self.running:
            # poll without waiting only while steps run: a queue stuck behind parked blocks waits for a message
            timeout = 0.0 if stepped else IDLE_POLL_SECONDS
            while self.running and self.conn.poll(timeout):
                self.handle(self.conn.recv())
                timeout = 0.0
            stepped = self.running and self.engine.has_unfinished() and self.step()
        for handle in self.handles.values():
            self.transport.release(handle)

    def handle(self, msg: object) -> None:
        match msg:
            case m.RunRequest():
                self._run_request(msg)
            case m.Adopt():
                self._adopt(msg)
            case m.ReleaseKV(request_id=rid) | m.Abort(request_id=rid):
                handle = self.handles.pop(rid, None)
                if handle is not None:
                    self.transport.release(handle)
                self.engine.release(rid)
                self.conn.send(m.Capacity(self.spec.worker_id, self.engine.kv_cache.allocator.num_free))
            case m.Shutdown():
                self.running = False
            case m.TakeCheckpoint():
                self._checkpoint(msg)
            case m.Resume():
                pass  # only meaningful while holding after a checkpoint (see _hold)
            case m.Restore():
                self._restore(Path(msg.path))
            case _:
                raise TypeError(f"unknown message {msg!r}")

    def _run_request(self, msg: m.RunRequest) -> None:
        try:
            self.engine.add_request(msg.prompt_token_ids, msg.params, request_id=msg.request_id,
                                    output_token_ids=msg.output_token_ids, seed=msg.seed)
        except PromptError as exc:
            self.conn.send(m.RequestFailed(msg.request_id, str(exc)))

    def _adopt(self, msg: m.Adopt) -> None:
        try:
            kv, seconds = timed_fetch(self.transport, msg.handle, self.engine.device)
        except HandoffError as exc:
            self.conn.send(m.AdoptFailed(msg.request_id, str(exc), retryable=False))
            return
        try:
            start = time.perf_counter()
            self.engine.import_sequence(msg.request_id, msg.prompt_token_ids, msg.output_token_ids,
                                        msg.params, msg.seed, kv)
            seconds += time.perf_counter() - start
        except OutOfBlocks as exc:
            self.conn.send(m.AdoptFailed(msg.request_id, str(exc), retryable=True))
            return
        free = self.engine.kv_cache.allocator.num_free
        self.conn.send(m.Adopted(msg.request_id, msg.handle.nbytes, seconds, free))

    def step(self) -> bool:
        """Run one engine step and report it; False when nothing could be scheduled."""
        outputs = self.engine.step()
        stats = self.engine.last_step
        if stats is None:
            return False
        tokens = [m.TokenEvent(o.request_id, o.token_id, o.finished, o.finish_reason) for o in outputs]
        scheduler = self.engine.scheduler
        cost = self.cost.step(stats.new_tokens, stats.context_lens)
        self.conn.send(m.StepReport(
            worker_id=self.spec.worker_id, phase=stats.phase, tokens=tokens, seq_tokens=list(stats.new_tokens),
            num_seqs=stats.num_seqs, num_tokens=stats.num_tokens, context_tokens=stats.context_tokens,
            seconds=stats.seconds, flops=cost.flops, bytes=cost.bytes,
            free_blocks=self.engine.kv_cache.allocator.num_free, running=len(scheduler.running),
            waiting=len(scheduler.waiting), ended_at=time.time(),
        ))
        for out in outputs:
            if not out.finished and out.request_id in scheduler.parked:
                self._publish(out.request_id)
        return True

    def _publish(self, request_id: str) -> None:
        start = time.perf_counter()
        handle = self.transport.publish(self.engine.export_kv(request_id))
        self.handles[request_id] = handle
        self.conn.send(m.Prefilled(request_id, handle, time.perf_counter() - start))

    def _checkpoint(self, msg: m.TakeCheckpoint) -> None:
        """Runs between steps: the engine is paused for as long as this takes."""
        paused_at = time.time()
        start = time.perf_counter()
        try:
            path, sessions, nbytes = write_engine_checkpoint(
                self.engine, self.spec.worker_id, self.spec.role, self.compat, Path(msg.root), msg.name,
                on_writer=lambda pid: self.conn.send(m.CheckpointStarted(pid, paused_at)),
            )
        except (CheckpointError, OSError) as exc:
            self.conn.send(m.CheckpointFailed(str(exc)))
            return
        self.conn.send(m.CheckpointDone(str(path), sessions, nbytes, time.perf_counter() - start, paused_at))
        if msg.after is m.CheckpointAfter.STAND_DOWN:
            self.running = False
        elif msg.after is m.CheckpointAfter.HOLD:
            self._hold()

    def _restore(self, path: Path) -> None:
        """Verify every file and the role before anything is loaded; then restore (or cold start)."""
        try:
            checkpoint = read_checkpoint(path)
            if checkpoint.role is not self.spec.role:
                raise CheckpointError(f"{path} is a {checkpoint.role} worker's checkpoint; a checkpoint never "
                                      f"changes a worker's role")
        except CheckpointError as exc:
            self.conn.send(m.RestoreFailed(str(exc)))
            return
        result = restore_engine(self.engine, checkpoint, self.compat)
        ids = [record.request_id for record in checkpoint.sessions]
        self.conn.send(m.Restored(result.mode, result.reason, result.sessions, result.nbytes, result.seconds,
                                  ids))
        for rid in list(self.engine.scheduler.parked):
            self._publish(rid)

    def _hold(self) -> None:
        """Paused after a checkpoint (a migration in progress): no steps until Resume or Shutdown."""
        while self.running:
            msg = self.conn.recv()
            if isinstance(msg, m.Resume):
                return
            self.handle(msg)
