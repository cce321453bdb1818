"""The worker's side of checkpoints: snapshot the engine and write it from a forked child (so the
write can fail or be killed without touching the serving process), and restore an engine from one."""

import errno
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

ROOM_BESIDE_KV = 1 << 20  # the manifest and the sessions' tokens (a guess: a write that still runs short fails cleanly)


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
        weights=engine.weight_format,
        kv_window=engine.kv_window.label if engine.kv_window else "none",
        rope_factors=engine.rope_factors,
        kv_dtype=engine.kv_cache.spec.kv_dtype.value,
    )


def write_engine_checkpoint(
    engine: LLMEngine, worker_id: str, role: WorkerRole, compat: Compat, root: Path, name: str,
    on_writer: Callable[[int], None],
) -> tuple[Path, int, int]:
    """Snapshot `engine` and write it in a forked child; `on_writer(pid)` runs once the child exists.
    Returns (path, sessions, bytes on disk). A failed or killed writer leaves nothing listed."""
    # the child gathers the used blocks from its copy-on-write view (one pool tensor: no windowed layers apart)
    if engine.device.type == "cpu" and engine.kv_cache.allocator.window is None:
        records, blocks = snapshot_records(engine)
        payload = payload_of_blocks(engine.kv_cache.tensor, blocks)
    else:
        records, kv = snapshot(engine)
        payload = payload_of(kv)
    check_room(root, payload.nbytes + ROOM_BESIDE_KV)
    why_read, why_write = os.pipe()  # the writer's last words: why it failed
    pid = os.fork()
    if pid == 0:  # the writer: no torch, no threads; always leaves through os._exit
        code = 1
        try:
            os.close(why_read)
            write_checkpoint(root, name, worker_id, role, compat, records, payload)
            code = 0
        except BaseException as exc:
            os.write(why_write, write_failure(exc, root).encode())
        finally:
            os._exit(code)
    os.close(why_write)
    on_writer(pid)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(why_read, "rb") as said:
        why = said.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        shutil.rmtree(root / (name + PARTIAL_SUFFIX), ignore_errors=True)
        how = f"killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"failed: {why or 'no reason'}"
        raise CheckpointError(f"the checkpoint writer {how}; nothing was saved")
    path = root / name
    return path, len(records), sum(f.stat().st_size for f in path.iterdir())


def check_room(root: Path, needed: int) -> None:
    """Refuse a checkpoint that cannot be written under `root` (a read-only volume, a disk without room for it)
    before anything is written."""
    folder = next(p for p in (root, *root.parents) if p.exists())
    if not os.access(folder, os.W_OK):
        raise CheckpointError(f"cannot write the checkpoint in {root}: {folder} is read-only")
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise CheckpointError(f"no room for the checkpoint in {root}: it needs {needed / 2**20:.1f} MiB and its disk "
                              f"has {free / 2**20:.1f} MiB free; free some space there")


def write_failure(exc: BaseException, root: Path) -> str:
    """Why the writer failed, for the operation's error: an OS error by its name (a full disk, an I/O error)."""
    if isinstance(exc, OSError) and exc.errno is not None:
        where = exc.filename or root
        return f"{exc.strerror} ({errno.errorcode.get(exc.errno, exc.errno)}) writing {where}"
    return f"{exc.__class__.__name__}: {exc}"


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
