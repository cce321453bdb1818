"""The worker's side of checkpoints: snapshot the engine and write it from a forked child (so the
write can fail or be killed without touching the serving process), and restore an engine from one."""

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

import fleetctl
from fleetctl.domain import WorkerRole
from fleetctl.engine.checkpoint.format import (
    KV_FILE,
    PARTIAL_SUFFIX,
    CheckpointError,
    Compat,
    RestoreMode,
    SavedCheckpoint,
    first_difference,
    write_checkpoint,
)
from fleetctl.engine.checkpoint.snapshot import (
    cold_start,
    payload_of,
    payload_of_blocks,
    restore_with_kv,
    snapshot,
    snapshot_records,
)
from fleetctl.engine.core.block_allocator import KV_LAYOUT_VERSION
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.metrics.gpu_sampler import driver_version
from fleetctl.engine.model.prepared import weights_key


@dataclass(frozen=True)
class RestoreResult:
    mode: RestoreMode
    reason: str | None  # the compat field that differed, for a cold start
    sessions: int
    nbytes: int  # KV bytes loaded (0 for a cold start)
    seconds: float


def current_compat(engine: LLMEngine, device_name: str) -> Compat:
    return Compat(
        device_kind=engine.device.type,
        device_name=device_name,
        driver=(driver_version() or "") if engine.device.type == "cuda" else "",
        torch=torch.__version__,
        engine=fleetctl.__version__,
        model_id=engine.config.model_dir.name,
        model_sha256=weights_key(engine.config.model_dir),
        dtype=str(engine.dtype).removeprefix("torch."),
        kv_layout=KV_LAYOUT_VERSION,
        block_size=engine.kv_cache.spec.block_size,
    )


def write_engine_checkpoint(
    engine: LLMEngine, worker_id: str, role: WorkerRole, compat: Compat, root: Path, name: str,
    on_writer: Callable[[int], None],
) -> tuple[Path, int, int]:
    """Snapshot `engine` and write it in a forked child; `on_writer(pid)` runs once the child exists.
    Returns (path, sessions, bytes on disk). A failed or killed writer leaves nothing listed."""
    if engine.device.type == "cpu":  # the child gathers the used blocks from its copy-on-write view
        records, blocks = snapshot_records(engine)
        payload = payload_of_blocks(engine.kv_cache.tensor, blocks)
    else:
        records, kv = snapshot(engine)
        payload = payload_of(kv)
    pid = os.fork()
    if pid == 0:  # the writer: no torch, no threads; always leaves through os._exit
        code = 1
        try:
            write_checkpoint(root, name, worker_id, role, compat, records, payload)
            code = 0
        finally:
            os._exit(code)
    on_writer(pid)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        shutil.rmtree(root / (name + PARTIAL_SUFFIX), ignore_errors=True)
        how = f"killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else "failed"
        raise CheckpointError(f"the checkpoint writer {how}; nothing was saved")
    path = root / name
    return path, len(records), sum(f.stat().st_size for f in path.iterdir())


def restore_engine(engine: LLMEngine, checkpoint: SavedCheckpoint, compat: Compat) -> RestoreResult:
    """Load a verified checkpoint's sessions into `engine`: with their KV when every compat field
    matches, else by recomputing them from their tokens (cold start)."""
    start = time.perf_counter()
    sessions = checkpoint.sessions
    reason = first_difference(checkpoint.manifest.compat, compat)
    if reason:
        cold_start(engine, sessions)
        return RestoreResult(RestoreMode.COLD_START, reason, len(sessions), 0, time.perf_counter() - start)
    kv = load_file(str(checkpoint.path / KV_FILE))["kv"]  # [layers, 2, n_blocks, block_size, Hkv, d]
    nbytes = restore_with_kv(engine, sessions, kv)
    return RestoreResult(RestoreMode.RESTORED, None, len(sessions), nbytes, time.perf_counter() - start)
