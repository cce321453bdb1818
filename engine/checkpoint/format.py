"""Checkpoint format v1: a worker's complete state on disk.

    <root>/<worker>-<utc>-<nnnn>/
        kv.safetensors   one tensor "kv" [layers, 2, n_blocks, block_size, Hkv, d]: only blocks in use
        sequences.json   per session: tokens, sampling params, seed, stop criteria, logical block table
        manifest.json    written last: format version, worker, role, compat fields, sha256 + size per file
        used.json        added when the checkpoint is restored (when, by which operation): not part of it

Written into `<name>.partial/` (fsynced), then renamed; a directory without a manifest, or any
`.partial`, is never listed or accepted. Directory 0700, files 0600. Weights are not copied: the
manifest pins the prepared weights' key (`Compat.model_sha256`).

No torch here: the controller lists and verifies checkpoints, and a forked writer child writes one.
"""

import hashlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from fleetctl.domain import WorkerRole
from fleetctl.engine.core.faults import fault_point
from fleetctl.engine.core.sequence import SamplingParams, SequenceStatus
from fleetctl.errors import UserError

FORMAT_VERSION = 1
PARTIAL_SUFFIX = ".partial"
MANIFEST = "manifest.json"
SEQUENCES = "sequences.json"
KV_FILE = "kv.safetensors"
USED = "used.json"


class CheckpointError(UserError):
    """A checkpoint that cannot be used: missing, corrupt, truncated, or not a v1 checkpoint."""


class RestoreMode(StrEnum):
    RESTORED = "restored"  # sessions resumed with their saved KV
    COLD_START = "cold-start"  # a compat field differed: sessions re-prefilled from their tokens


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Compat(_Record):
    """Everything that must match for a checkpoint's KV to be loaded as-is (else: cold start)."""

    device_kind: str
    device_name: str
    driver: str
    torch: str
    engine: str
    model_id: str
    model_sha256: str  # the prepared weights' key: a hash of the weight files' names, sizes and dtype
    dtype: str
    kv_layout: int
    block_size: int
    weights: str = "none"  # the layers' weight format (quantize.weight_source); older checkpoints were dense
    kv_window: str = "none"  # which leading blocks sessions dropped (kv_window.KVWindow.label); older: none
    rope_factors: str = "short"  # longrope's set the keys were rotated with (LLMEngine.rope_factors); older: short
    kv_dtype: str = "auto"  # the pool's stored format (EngineSettings.kv_dtype); older: auto, the model's dtype


class StopCriteria(_Record):
    eos_token_ids: list[int]
    max_tokens: int
    max_model_len: int


class SessionRecord(_Record):
    """One session: enough to continue it with its KV (block_table indexes kv.safetensors) or without."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    params: SamplingParams
    seed: int
    status: SequenceStatus
    num_cached_tokens: int  # tokens whose K/V are saved; 0 for a session waiting to be (re)computed
    block_table: list[int]  # its blocks from first_block on
    first_block: int = 0  # blocks before it were dropped (engine/core/kv_window.py) and are not saved
    session: str = ""  # the agent session it is a turn of (`--session-ttl`); older checkpoints name none
    stop_criteria: StopCriteria


class FileDigest(_Record):
    sha256: str
    size: int


class Manifest(_Record):
    format_version: Literal[1]
    worker: str
    role: WorkerRole
    compat: Compat
    files: dict[str, FileDigest]
    created: str  # UTC, ISO 8601


class _Sessions(_Record):
    sequences: list[SessionRecord]


@dataclass(frozen=True)
class SavedCheckpoint:
    path: Path
    manifest: Manifest
    sessions: list[SessionRecord]

    @property
    def worker_id(self) -> str:
        return self.manifest.worker

    @property
    def role(self) -> WorkerRole:
        return self.manifest.role


def first_difference(saved: Compat, current: Compat) -> str | None:
    """The first compat field that differs, as 'field: checkpoint has …, destination has …', or None."""
    for name, value in saved:
        if getattr(current, name) != value:
            return f"{name}: checkpoint has {value!r}, destination has {getattr(current, name)!r}"
    return None


def checkpoint_name(worker_id: str, root: Path) -> str:
    """`<worker>-<utc>-<nnnn>`: the last part (from the controller's pid) keeps fleets sharing a
    $FLEET_HOME apart within one second; a second checkpoint of the worker within the same second (a
    restore and another checkpoint) gets `-2`, `-3`, … rather than colliding with the first."""
    name = f"{worker_id}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid() % 10000:04d}"
    candidate, suffix = name, 1
    while (root / candidate).exists() or (root / (candidate + PARTIAL_SUFFIX)).exists():
        suffix += 1
        candidate = f"{name}-{suffix}"
    return candidate


def _write_file(path: Path, data: bytes) -> str:
    """Write and fsync; returns the sha256 of what was written."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return hashlib.sha256(data).hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# the pool's dtypes (int8: an int8 KV pool's rows of codes and scales)
SAFETENSORS_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "int8": "I8"}
_CHUNK = 1 << 20


@dataclass(frozen=True)
class KVPayload:
    """The KV tensor [layers, 2, n_blocks, block_size, Hkv, d] as raw bytes, taken before a fork so the
    writer child never calls into torch: a view of a CPU tensor's memory, read as `runs` of
    (offset, length) in order."""

    dtype: str  # safetensors dtype tag
    shape: tuple[int, ...]
    memory: memoryview
    runs: tuple[tuple[int, int], ...]

    @property
    def nbytes(self) -> int:
        return sum(length for _, length in self.runs)

    def chunks(self) -> Iterator[bytes | memoryview]:
        """The payload's bytes in order, as pieces of about _CHUNK bytes."""
        pending: list[memoryview] = []
        size = 0
        for offset, length in self.runs:
            for start in range(offset, offset + length, _CHUNK):
                piece = self.memory[start : min(start + _CHUNK, offset + length)]
                pending.append(piece)
                size += piece.nbytes
                if size >= _CHUNK:
                    yield b"".join(pending) if len(pending) > 1 else pending[0]
                    pending, size = [], 0
        if pending:
            yield b"".join(pending)


def _write_safetensors(path: Path, payload: KVPayload) -> str:
    """One tensor "kv" in the safetensors layout (u64 header length, JSON header, data), in chunks,
    hashed as it is written. Returns the file's sha256."""
    header = {"kv": {"dtype": payload.dtype, "shape": list(payload.shape), "data_offsets": [0, payload.nbytes]},
              "__metadata__": {"format": "fleetctl-kv-v1"}}
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    digest = hashlib.sha256()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        for chunk in (len(encoded).to_bytes(8, "little") + encoded, *payload.chunks()):
            digest.update(chunk)
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    return digest.hexdigest()


def write_checkpoint(root: Path, name: str, worker_id: str, role: WorkerRole, compat: Compat,
                     sessions: list[SessionRecord], kv: KVPayload) -> Path:
    """Writes `<root>/<name>` atomically (see the module docstring). Uses no torch: safe in a forked
    writer process. Returns the final directory."""
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    final = root / name
    partial = root / (name + PARTIAL_SUFFIX)
    partial.mkdir(mode=0o700)
    digests = {KV_FILE: _write_safetensors(partial / KV_FILE, kv)}
    fault_point("checkpoint-write")  # between the data and the manifest: the worst place to die
    digests |= {SEQUENCES: _write_file(partial / SEQUENCES, _Sessions(sequences=sessions).model_dump_json().encode())}
    files = {n: FileDigest(sha256=digest, size=(partial / n).stat().st_size) for n, digest in digests.items()}
    manifest = Manifest(format_version=FORMAT_VERSION, worker=worker_id, role=role, compat=compat, files=files,
                        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    _write_file(partial / MANIFEST, manifest.model_dump_json(indent=2).encode())
    _fsync_dir(partial)
    os.rename(partial, final)
    _fsync_dir(root)
    return final


def read_manifest(path: Path) -> Manifest:
    """The manifest alone, checked for shape but with no file verified (for listings)."""
    if path.name.endswith(PARTIAL_SUFFIX):
        raise CheckpointError(f"{path} is an unfinished checkpoint")
    try:
        raw = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: {MANIFEST} is missing (not a finished checkpoint)") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path / MANIFEST} is corrupt: {exc}") from None
    if isinstance(raw, dict) and raw.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: format version {raw.get('format_version')!r} is not {FORMAT_VERSION}")
    try:
        return Manifest.model_validate(raw)
    except ValidationError as exc:
        raise CheckpointError(f"{path}: manifest malformed ({_first_error(exc)})") from None


def read_checkpoint(path: Path) -> SavedCheckpoint:
    """Verify every file's size and sha256 against the manifest, then parse. Raises CheckpointError."""
    manifest = read_manifest(path)
    for name, expected in manifest.files.items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{file} is missing")
        if file.stat().st_size != expected.size:
            raise CheckpointError(f"{file} is truncated or padded ({file.stat().st_size} bytes, "
                                  f"manifest says {expected.size})")
        with file.open("rb") as f:
            if hashlib.file_digest(f, "sha256").hexdigest() != expected.sha256:
                raise CheckpointError(f"{file} is corrupt (sha256 mismatch)")
    if SEQUENCES not in manifest.files or KV_FILE not in manifest.files:
        raise CheckpointError(f"{path}: manifest does not list {SEQUENCES} and {KV_FILE}")
    try:
        sessions = _Sessions.model_validate_json((path / SEQUENCES).read_bytes()).sequences
    except ValidationError as exc:
        raise CheckpointError(f"{path / SEQUENCES} malformed ({_first_error(exc)})") from None
    return SavedCheckpoint(path, manifest, sessions)


def _first_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    return f"{where}: {first['msg']}" if where else first["msg"]


def list_checkpoints(root: Path) -> list[Path]:
    """Finished checkpoints (a manifest present, no .partial suffix), oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and not p.name.endswith(PARTIAL_SUFFIX)
             and (p / MANIFEST).is_file()]
    return sorted(found, key=lambda p: p.stat().st_mtime)


def mark_used(path: Path, operation: str) -> str:
    """Record that `path` was restored (a sidecar the manifest does not list); returns the UTC time."""
    used_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    partial = path / (USED + PARTIAL_SUFFIX)
    _write_file(partial, json.dumps({"used_at": used_at, "operation": operation}).encode())
    os.replace(partial, path / USED)
    return used_at


def used_at(path: Path) -> str | None:
    """When `path` was restored, if it was (an unreadable sidecar counts as used: refuse, never replay)."""
    try:
        return str(json.loads((path / USED).read_text())["used_at"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return "unknown"
