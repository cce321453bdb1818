"""The worker's loop: one engine, one device, one role. It only loops and talks: messages in,
engine steps, reports out. The controller decides everything else.

One request cannot take the worker down: an exception while adding, adopting or publishing a request
drops that request alone (`RequestFailed`, retry), and a step that raises is run again one sequence at
a time, so that only the sequence that still raises on its own is dropped and its batch-mates continue
(re-running is safe: a step that raised appended no token, and a re-run rewrites the same KV slots).

An error that poisons the device (a sticky CUDA error: `device_errors`) is no request's: every later step
would fail too, so the worker stops — it says why and its process exits non-zero — and the supervisor
restarts it on a fresh CUDA context."""

import dataclasses
import os
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path

from fleetctl.domain import Phase, WorkerRole
from fleetctl.engine.checkpoint.engine_io import current_compat, restore_engine, write_engine_checkpoint
from fleetctl.engine.checkpoint.format import CheckpointError, read_checkpoint
from fleetctl.engine.core.block_allocator import OutOfBlocks
from fleetctl.engine.core.device_errors import poisons_device
from fleetctl.engine.core.faults import InjectedFault, fault_point
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.output import RequestOutput
from fleetctl.engine.core.prompt import PromptError
from fleetctl.engine.core.scheduler import ScheduledStep
from fleetctl.engine.metrics.calibration import machine_lock
from fleetctl.engine.metrics.cost_model import CostModel
from fleetctl.engine.metrics.device_peaks import device_peaks
from fleetctl.engine.worker import move_messages as mv
from fleetctl.engine.worker import protocol as m
from fleetctl.engine.worker.heartbeat import Heartbeat
from fleetctl.engine.worker.kv_transport import HandoffError, KVTransport, timed_fetch
from fleetctl.engine.worker.prefix_summary import PrefixSummary
from fleetctl.engine.worker.session_mover import SessionMover
from fleetctl.engine.worker.spec import WorkerSpec
from fleetctl.errors import FleetctlError

IDLE_POLL_SECONDS = 0.02


class Worker:
    def __init__(self, spec: WorkerSpec, conn: Connection, transport: KVTransport | None = None) -> None:
        self.spec = spec
        self.conn = conn
        self._send_lock = threading.Lock()  # the heartbeat thread sends too
        with machine_lock(exclusive=False):  # no sibling calibrates while this worker loads (and compiles)
            self.engine = LLMEngine(spec.engine_config())
            self._compile_decode_step()
        self.transport = transport or KVTransport(spec.shm_dir, spec.fleet_pid)
        self.heartbeat = Heartbeat(spec.worker_id, self.send, spec.heartbeat_s, spec.step_timeout_s)
        self.handles: dict[str, m.KVHandle] = {}
        self.mover = SessionMover(self.engine, self.transport, self.send, self._capacity)
        self.prefix_summary = PrefixSummary()
        self.running = True
        weights, kv = self.engine.model.weights, self.engine.kv_cache.spec
        self.cost = CostModel(self.engine.model_config, weight_bytes=self.engine.dtype.itemsize,
                              kv_bytes=kv.bytes_per_value,
                              layer_bytes=weights.layer_matrix_bytes, head_bytes=weights.head_bytes)
        self.peaks = device_peaks(self.engine.device, self.engine.dtype, self.cost.weight_bytes_per_step,
                                  spec.store_path)

    def _compile_decode_step(self) -> None:
        """Compile the kernels and every decode batch bucket before reporting ready, saying so on stderr when
        the decode step compiles (a cold compile takes a while)."""
        decoder = self.engine.decoder
        name = self.spec.worker_id
        if decoder is not None:
            print(f"fleetctl: {name}: compiling the decode step for batches of {', '.join(map(str, decoder.buckets))}",
                  file=sys.stderr, flush=True)
        seconds = self.engine.warm_up()
        if decoder is not None:
            print(f"fleetctl: {name}: decode step compiled in {seconds:.1f} s", file=sys.stderr, flush=True)

    def send(self, msg: object) -> None:
        with self._send_lock:
            self.conn.send(msg)

    def run(self) -> None:
        allocator = self.engine.kv_cache.allocator
        self.compat = current_compat(self.engine, self.peaks.name)
        self.send(m.WorkerReady(
            self.spec.worker_id, os.getpid(), allocator.num_blocks, self.engine.kv_cache.spec.block_size,
            self.engine.load_seconds, self.peaks.name, self.peaks.peak_flops, self.peaks.peak_bytes_per_s,
            self.engine.weights_label, self.engine.kv_cache.spec.label,
        ))
        self.heartbeat.start()
        try:
            stepped = False
            while self.running:
                # poll without waiting only while steps run: a queue stuck behind parked blocks waits for a message
                timeout = 0.0 if stepped else IDLE_POLL_SECONDS
                while self.running and self.conn.poll(timeout):
                    self.receive(self.conn.recv())
                    timeout = 0.0
                stepped = self.running and self.engine.has_unfinished() and self.step()
        finally:  # also when the controller is gone: what this worker published dies with it
            self.heartbeat.stop()
            for handle in self.handles.values():
                self.transport.release(handle)
            self.mover.release_all()

    def receive(self, msg: object) -> None:
        """Handle one message; an exception while handling a request's message drops that request only."""
        try:
            self.handle(msg)
        except Exception as exc:
            request_id = getattr(msg, "request_id", None)
            if request_id is None:
                raise
            self._drop(request_id, exc)

    def _drop(self, request_id: str, exc: Exception) -> None:
        """Serving `request_id` raised: forget it here (blocks, published KV) and say so; unless `exc`
        poisoned the device: then it is raised on, out of the loop, and the worker stops."""
        if poisons_device(exc):
            raise exc
        if os.environ.get("FLEET_DEBUG"):
            traceback.print_exc()
        print(f"fleetctl: {self.spec.worker_id}: request {request_id} failed: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)
        handle = self.handles.pop(request_id, None)
        if handle is not None:
            self.transport.release(handle)
        self.engine.release(request_id)
        self.send(m.RequestFailed(request_id, f"{type(exc).__name__}: {exc}", retry=True))
        self._capacity()

    def _capacity(self) -> None:
        self.send(m.Capacity(self.spec.worker_id, self.engine.kv_cache.allocator.num_free))

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
                self._capacity()
            case mv.ReserveBlocks() | mv.SendBlocks() | mv.ReceiveBlocks() | mv.EndMove():
                self.mover.handle(msg)
            case m.Rename(worker_id=worker_id):
                self.spec = dataclasses.replace(self.spec, worker_id=worker_id)
                self.heartbeat.worker_id = worker_id
            case m.Shutdown():
                self.running = False
            case m.TakeCheckpoint():
                self._checkpoint(msg)
            case m.Resume():
                pass  # only meaningful while holding after a checkpoint (see _hold)
            case m.Restore():
                self._restore(Path(msg.path))
            case m.SwitchRole():
                self._switch(msg)
            case _:
                raise TypeError(f"unknown message {msg!r}")

    def _run_request(self, msg: m.RunRequest) -> None:
        fault_point("run-request", msg.request_id)
        try:
            self.engine.add_request(msg.prompt_token_ids, msg.params, request_id=msg.request_id,
                                    output_token_ids=msg.output_token_ids, seed=msg.seed, session=msg.session)
        except PromptError as exc:
            self.send(m.RequestFailed(msg.request_id, str(exc)))

    def _adopt(self, msg: m.Adopt) -> None:
        try:
            kv, seconds = timed_fetch(self.transport, msg.handle, self.engine.device)
        except HandoffError as exc:
            self.send(m.AdoptFailed(msg.request_id, str(exc), retryable=False))
            return
        fault_point("adopt", msg.request_id)  # the KV fetched, not yet in this worker's blocks
        try:
            start = time.perf_counter()
            self.engine.import_sequence(msg.request_id, msg.prompt_token_ids, msg.output_token_ids,
                                        msg.params, msg.seed, kv, msg.handle.first_block, session=msg.session)
            seconds += time.perf_counter() - start
        except OutOfBlocks as exc:
            self.send(m.AdoptFailed(msg.request_id, str(exc), retryable=True))
            return
        free = self.engine.kv_cache.allocator.num_free
        self.send(m.Adopted(msg.request_id, msg.handle.nbytes, seconds, free, self.transport.is_remote(msg.handle)))

    def step(self) -> bool:
        """Run one engine step and report it; False when nothing could be scheduled."""
        scheduled = self.engine.schedule()
        if scheduled is None:
            return False
        try:
            outputs = self._run(scheduled)
        except Exception as exc:
            self._isolate(scheduled, exc)
        else:
            self._report(outputs)
        return True

    def _isolate(self, scheduled: ScheduledStep, exc: Exception) -> None:
        """The step raised: run its sequences one at a time; only one that raises on its own is dropped."""
        if len(scheduled.seqs) == 1:
            self._drop(scheduled.seqs[0].request_id, exc)
            return
        for seq in scheduled.seqs:
            try:
                outputs = self._run(scheduled.only(seq))
            except Exception as alone:
                self._drop(seq.request_id, alone)
            else:
                self._report(outputs)

    def _run(self, scheduled: ScheduledStep) -> list[RequestOutput]:
        with self.heartbeat.step():
            for seq in scheduled.seqs:
                fault_point("step", seq.request_id)
            return self.engine.run(scheduled)

    def _report(self, outputs: list[RequestOutput]) -> None:
        """Send the step's tokens. A sequence the step parked (a prefill worker's) has its KV published first:
        its first token and its handoff arrive as one event. One whose publishing raised is dropped after the
        report, its token sent without a handoff."""
        ended_at = time.time()
        stats = self.engine.last_step
        assert stats is not None
        scheduler = self.engine.scheduler
        handoffs, failed = self._publish_parked(outputs)
        tokens = [m.TokenEvent(o.request_id, o.token_id, o.finished, o.finish_reason, o.logprobs,
                               handoffs.get(o.request_id)) for o in outputs]
        computed = dict(zip(stats.request_ids, stats.new_tokens, strict=True))
        # a sequence's computed tokens go with its first token event (later ones: a verified draft's, 0); what is
        # left: prefill chunks, no token yet
        seq_tokens = [computed.pop(o.request_id, 0) for o in outputs]
        cost = self.cost.step(stats.new_tokens, stats.context_lens)
        prefill = stats.phase is Phase.PREFILL
        urgent = prefill or any(o.finished for o in outputs)
        self.send(m.StepReport(
            worker_id=self.spec.worker_id, phase=stats.phase, tokens=tokens, seq_tokens=seq_tokens, chunks=computed,
            num_seqs=stats.num_seqs, num_tokens=stats.num_tokens, context_tokens=stats.context_tokens,
            seconds=stats.seconds, flops=cost.flops, bytes=cost.bytes,
            free_blocks=self.engine.kv_cache.allocator.num_free, running=len(scheduler.running),
            waiting=len(scheduler.waiting), ended_at=ended_at,
            cached_tokens={rid: hit for rid, hit in zip(stats.request_ids, stats.cached_tokens, strict=True) if hit},
            tier_tokens=stats.tier_tokens, tier_io=self.engine.tier_io(),
            prefix=self.prefix_summary.changes(self.engine.prefix_digest, time.monotonic(), urgent),
            mask_seconds=stats.mask_seconds, drafted=sum(stats.drafted), accepted=sum(stats.accepted),
            verifications=sum(1 for drafted in stats.drafted if drafted),
        ))
        for request_id, exc in failed.items():
            self._drop(request_id, exc)

    def _publish_parked(self, outputs: list[RequestOutput]) -> tuple[dict[str, m.Handoff], dict[str, Exception]]:
        """The handoffs of the sequences the step parked, and what publishing raised for those it could not."""
        handoffs: dict[str, m.Handoff] = {}
        failed: dict[str, Exception] = {}
        for out in outputs:
            if not out.finished and out.request_id in self.engine.scheduler.parked:
                try:
                    handoffs[out.request_id] = self._publish(out.request_id)
                except Exception as exc:
                    failed[out.request_id] = exc
        return handoffs, failed

    def _publish(self, request_id: str) -> m.Handoff:
        """Publish a parked sequence's KV (from the first block its window keeps) for a decode worker."""
        fault_point("publish", request_id)  # its first token made, neither sent nor its KV published
        start = time.perf_counter()
        first_block, kv = self.engine.export_kv(request_id)
        handle = dataclasses.replace(self.transport.publish(kv), first_block=first_block)
        self.handles[request_id] = handle
        return m.Handoff(handle, time.perf_counter() - start)

    def _checkpoint(self, msg: m.TakeCheckpoint) -> None:
        """Runs between steps: the engine is paused for as long as this takes."""
        paused_at = time.time()
        start = time.perf_counter()
        try:
            path, sessions, nbytes = write_engine_checkpoint(
                self.engine, self.spec.worker_id, self.spec.role, self.compat, Path(msg.root), msg.name,
                on_writer=lambda pid: self.send(m.CheckpointStarted(pid, paused_at)),
            )
        except (FleetctlError, OSError) as exc:  # expected: the checkpoint failed, and says why
            self.send(m.CheckpointFailed(str(exc)))
            return
        self.send(m.CheckpointDone(str(path), sessions, nbytes, time.perf_counter() - start, paused_at))
        if msg.after is m.CheckpointAfter.STAND_DOWN:
            self.running = False
        elif msg.after is m.CheckpointAfter.HOLD:
            self._hold()

    def _restore(self, path: Path) -> None:
        """Verify every file and the role before anything is loaded; then restore (or cold start)."""
        try:
            fault_point("restore")
            checkpoint = read_checkpoint(path)
            if checkpoint.role is not self.spec.role:
                raise CheckpointError(f"{path} is a {checkpoint.role} worker's checkpoint; a checkpoint never "
                                      f"changes a worker's role")
        except (FleetctlError, InjectedFault) as exc:
            self.send(m.RestoreFailed(str(exc)))
            return
        result = restore_engine(self.engine, checkpoint, self.compat)
        ids = [record.request_id for record in checkpoint.sessions]
        self.send(m.Restored(result.mode, result.reason, result.sessions, result.nbytes, result.seconds, ids))
        for rid in list(self.engine.scheduler.parked):
            try:
                self.send(m.Republished(rid, self._publish(rid)))
            except Exception as exc:
                self._drop(rid, exc)

    def _switch(self, msg: m.SwitchRole) -> None:
        """Between steps, holding no session: the same process serves `msg.role` from the next step on."""
        try:
            fault_point("switch", self.spec.worker_id)
            seconds = self.engine.switch_role(prefill_only=msg.role is WorkerRole.PREFILL)
        except (FleetctlError, InjectedFault) as exc:
            self.send(m.SwitchFailed(f"{type(exc).__name__}: {exc}"))
            return
        self.spec = dataclasses.replace(self.spec, role=msg.role, worker_id=msg.worker_id)
        self.heartbeat.worker_id = msg.worker_id
        self.send(m.RoleSwitched(msg.worker_id, msg.role, seconds))

    def _hold(self) -> None:
        """Paused after a checkpoint (a migration in progress): no steps until Resume or Shutdown."""
        while self.running:
            msg = self.conn.recv()
            if isinstance(msg, m.Resume):
                return
            self.receive(msg)
