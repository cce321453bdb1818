"""Checkpoint and restore for the fake workers (fake_workers.py): real v1 checkpoints (the torch-free
writer), a real writer *process* (a `sleep` the controller may kill, as it kills a real forked writer),
and the worker's answers: started, done or failed; stand down, hold until Resume, or serve on; restore
its sessions (a prefill worker re-publishing the parked ones) or refuse."""

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fleetctl.domain import WorkerRole
from fleetctl.engine.checkpoint.format import (
    CheckpointError,
    Compat,
    KVPayload,
    RestoreMode,
    SessionRecord,
    StopCriteria,
    read_checkpoint,
    write_checkpoint,
)
from fleetctl.engine.core.sequence import SequenceStatus
from fleetctl.engine.worker import protocol as m

if TYPE_CHECKING:
    from support.fake_workers import FakeWorker

COMPAT = Compat(device_kind="cpu", device_name="fake", driver="", torch="fake", engine="fake", model_id="fake",
                model_sha256="fake", dtype="float32", kv_layout=1, block_size=16)
BLOCK_BYTES = 8  # a session's KV here: one block of shape (1, 2, 1, 1, 1, 1) float32


@dataclass
class Session:
    msg: m.RunRequest | m.Adopt
    output: list[int]
    prefilled: bool = False


class FakeCheckpoints:
    def __init__(self, worker: "FakeWorker") -> None:
        self.worker = worker

    def handle(self, msg: object) -> bool:
        """False when the worker exits (stood down, or shut down while holding)."""
        match msg:
            case m.TakeCheckpoint():
                return self._checkpoint(msg)
            case m.Restore():
                self._restore(Path(msg.path))
        return True  # a Resume outside a hold: nothing to do

    def _checkpoint(self, msg: m.TakeCheckpoint) -> bool:
        worker = self.worker
        paused_at, start = time.time(), time.perf_counter()
        writer = subprocess.Popen(["sleep", str(worker.faults.checkpoint_s.get(worker.spec.worker_id, 0.0))])
        worker.send(m.CheckpointStarted(writer.pid, paused_at))
        if writer.wait() != 0:
            worker.send(m.CheckpointFailed(f"the checkpoint writer was killed by signal {-writer.returncode}"))
            return True
        records = [self._record(rid, session) for rid, session in worker.sessions.items()]
        payload = KVPayload("F32", (1, 2, len(records), 1, 1, 1), memoryview(bytes(BLOCK_BYTES * len(records))),
                            ((0, BLOCK_BYTES * len(records)),))
        path = write_checkpoint(Path(msg.root), msg.name, worker.spec.worker_id, worker.spec.role, COMPAT, records,
                                payload)
        worker.send(m.CheckpointDone(str(path), len(records), payload.nbytes, time.perf_counter() - start, paused_at))
        if msg.after is m.CheckpointAfter.STAND_DOWN:
            worker.remove_published()
            return False
        if msg.after is m.CheckpointAfter.HOLD:
            while True:
                held = worker.conn.recv()
                worker.received.append(held)
                if isinstance(held, m.Resume):
                    return True
                if isinstance(held, m.Shutdown):
                    worker.remove_published()
                    return False
        return True

    def _record(self, rid: str, session: Session) -> SessionRecord:
        index = list(self.worker.sessions).index(rid)
        parked = self.worker.spec.role is WorkerRole.PREFILL and session.prefilled
        status = SequenceStatus.PARKED if parked else (
            SequenceStatus.RUNNING if session.prefilled else SequenceStatus.WAITING)
        msg = session.msg
        return SessionRecord(
            request_id=rid, prompt_token_ids=msg.prompt_token_ids, output_token_ids=session.output,
            params=msg.params, seed=msg.seed, status=status,
            num_cached_tokens=len(msg.prompt_token_ids) + len(session.output) - 1 if session.prefilled else 0,
            block_table=[index] if session.prefilled else [],
            stop_criteria=StopCriteria(eos_token_ids=[], max_tokens=msg.params.max_tokens, max_model_len=1024))

    def _restore(self, path: Path) -> None:
        worker = self.worker
        try:
            if worker.spec.worker_id in worker.faults.fail_restore:
                raise CheckpointError("fault injected at restore")
            saved = read_checkpoint(path)
        except CheckpointError as exc:
            worker.send(m.RestoreFailed(str(exc)))
            return
        for record in saved.sessions:
            run = m.RunRequest(record.request_id, record.prompt_token_ids, record.params, record.seed)
            worker.sessions[record.request_id] = Session(run, list(record.output_token_ids),
                                                         prefilled=record.num_cached_tokens > 0)
        worker.send(m.Restored(RestoreMode.RESTORED, None, len(saved.sessions), BLOCK_BYTES * len(saved.sessions),
                               0.001, [record.request_id for record in saved.sessions]))
        for record in saved.sessions:
            if record.status is SequenceStatus.PARKED:
                worker.send(m.Republished(record.request_id, worker.publish(record.request_id)))
