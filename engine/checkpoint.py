"""Checkpoint format v1: a worker's complete state on disk.

    <root>/<worker>-<utc>/
        kv.safetensors   one tensor "kv" [layers, 2, n_blocks, block_size, Hkv, d]: only blocks in use
        sequences.json   per sequence: tokens, sampling params, seed, stop criteria, logical block table
        manifest.json    written last: format version, worker, role, compat fields, sha256 + size per file

Written into `<name>.partial/` (fsynced), then renamed; a directory without a manifest, or any
`.partial`, is never listed or accepted. Directory 0700, files 0600. Weights are not copied: the
manifest pins the model's sha256.
"""

import hashlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

FORMAT_VERSION = 1
PARTIAL_SUFFIX = ".partial"
MANIFEST = "manifest.json"
SEQUENCES = "sequences.json"
KV_FILE = "kv.safetensors"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, corrupt, truncated, or not a v1 checkpoint."""


@dataclass(frozen=True)
class Compat:
    """Everything that must match for a checkpoint's KV to be loaded as-is (else: cold start)."""

    device_kind: str
    device_name: str
    driver: str
    torch: str
    engine: str
    model_id: str
    model_sha256: str
    dtype: str
    kv_layout: int
    block_size: int


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    worker_id: str
    role: str
    compat: Compat
    sequences: list[dict]
    created: str

    def load_kv(self) -> torch.Tensor:
        """[layers, 2, n_blocks, block_size, Hkv, d] on the CPU."""
        return load_file(str(self.path / KV_FILE))["kv"]


def first_difference(saved: Compat, current: Compat) -> str | None:
    """The first compat field that differs, as 'field: saved != current', or None."""
    for name, value in asdict(saved).items():
        if getattr(current, name) != value:
            return f"{name}: checkpoint has {value!r}, destination has {getattr(current, name)!r}"
    return None


def checkpoint_name(worker_id: str) -> str:
    return f"{worker_id}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid() % 10000:04d}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


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


_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
_CHUNK = 1 << 20


@dataclass(frozen=True)
class KVPayload:
    """The KV tensor [layers, 2, n_blocks, block_size, Hkv, d] as raw bytes, taken before a fork so the
    writer child never calls into torch: a view of a CPU tensor's memory, read as `runs` of
    (offset, length) in order. Gathering from the live pool this way costs the paused worker no copy:
    the forked child reads its own copy-on-write view of the pool."""

    dtype: str  # safetensors dtype tag
    shape: tuple[int, ...]
    memory: memoryview
    runs: tuple[tuple[int, int], ...]

    @property
    def nbytes(self) -> int:
        return sum(length for _, length in self.runs)

    @classmethod
    def of(cls, kv: torch.Tensor) -> "KVPayload":
        """kv: [layers, 2, n_blocks, block_size, Hkv, d] on the CPU."""
        kv = kv.contiguous()
        memory = memoryview(kv.view(torch.uint8).reshape(-1).numpy()).cast("B")
        return cls(_SAFETENSORS_DTYPES[kv.dtype], tuple(kv.shape), memory, ((0, memory.nbytes),))

    @classmethod
    def of_blocks(cls, pool: torch.Tensor, blocks: list[int]) -> "KVPayload":
        """pool: the whole CPU pool [layers, 2, blocks, block_size, Hkv, d]; the payload is its `blocks`."""
        layers, _, num_blocks, *block_shape = pool.shape
        memory = memoryview(pool.view(torch.uint8).reshape(-1).numpy()).cast("B")
        block_bytes = memory.nbytes // (layers * 2 * num_blocks)
        runs = tuple((((layer * 2 + half) * num_blocks + block) * block_bytes, block_bytes)
                     for layer in range(layers) for half in range(2) for block in blocks)
        return cls(_SAFETENSORS_DTYPES[pool.dtype], (layers, 2, len(blocks), *block_shape), memory, runs)

    def chunks(self) -> "Iterator[bytes | memoryview]":
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


def _chunks(header: bytes, data: memoryview):
    yield header
    for offset in range(0, data.nbytes, _CHUNK):
        yield data[offset : offset + _CHUNK]


def write_checkpoint(root: Path, name: str, worker_id: str, role: str, compat: Compat,
                     sequences: list[dict], kv: KVPayload) -> Path:
    """Writes `<root>/<name>` atomically (see the module docstring). Uses no torch: safe in a forked
    writer process. Returns the final directory."""
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    final = root / name
    partial = root / (name + PARTIAL_SUFFIX)
    partial.mkdir(mode=0o700)
    digests = {KV_FILE: _write_safetensors(partial / KV_FILE, kv),
               SEQUENCES: _write_file(partial / SEQUENCES, json.dumps({"sequences": sequences}).encode())}
    files = {n: {"sha256": digest, "size": (partial / n).stat().st_size} for n, digest in digests.items()}
    manifest = {"format_version": FORMAT_VERSION, "worker": worker_id, "role": role, "compat": asdict(compat),
                "files": files, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    _write_file(partial / MANIFEST, json.dumps(manifest, indent=2).encode())
    _fsync_dir(partial)
    os.rename(partial, final)
    _fsync_dir(root)
    return final


def read_checkpoint(path: Path) -> Checkpoint:
    """Verify every file's size and sha256 against the manifest, then parse. Raises CheckpointError."""
    if path.name.endswith(PARTIAL_SUFFIX):
        raise CheckpointError(f"{path} is an unfinished checkpoint")
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: {MANIFEST} is missing (not a finished checkpoint)") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path / MANIFEST} is corrupt: {exc}") from None
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: format version {manifest.get('format_version')!r} is not {FORMAT_VERSION}")
    try:
        for name, expected in manifest["files"].items():
            file = path / name
            if not file.is_file():
                raise CheckpointError(f"{file} is missing")
            if file.stat().st_size != expected["size"]:
                raise CheckpointError(f"{file} is truncated or padded ({file.stat().st_size} bytes, "
                                      f"manifest says {expected['size']})")
            if _sha256(file) != expected["sha256"]:
                raise CheckpointError(f"{file} is corrupt (sha256 mismatch)")
        sequences = json.loads((path / SEQUENCES).read_text())["sequences"]
        return Checkpoint(path=path, worker_id=manifest["worker"], role=manifest["role"],
                          compat=Compat(**manifest["compat"]), sequences=sequences, created=manifest["created"])
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"{path}: manifest or sequences malformed ({exc})") from None


def list_checkpoints(root: Path) -> list[Path]:
    """Finished checkpoints (a manifest present, no .partial suffix), oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and not p.name.endswith(PARTIAL_SUFFIX)
             and (p / MANIFEST).is_file()]
    return sorted(found, key=lambda p: p.stat().st_mtime)
