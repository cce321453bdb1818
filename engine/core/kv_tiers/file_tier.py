"""One of the node-wide KV tiers: a folder of block records (`block_file`), one file per block named
by its digest, bounded in bytes, least recently used evicted first. The host-memory tier is such a folder under
/dev/shm (shared by every worker process of the node), the disk tier one under `--kv-offload-dir`.

Across processes, with no lock: a block is written to a temporary file of the writer's own (pid and a counter
in its name) and renamed over its final name, which is atomic, so two workers storing the same block at once
leave one whole copy and a reader never sees half of one. Recency is the file's mtime (a hit touches it,
from the nanosecond clock);
after a write the writer that took the tier past its bound deletes the oldest files until it fits again
(`usage` is a folder scan, cheap at the tiers' thousands of blocks). A record that does not check out is a
miss and is deleted. A tier whose filesystem refuses a write (full, read-only, failing) turns itself off — a
no-op from then on, saying why — rather than failing the engine that uses it."""

import contextlib
import errno
import itertools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from fleetctl.engine.core.faults import fault_point
from fleetctl.engine.core.kv_tiers.block_file import CorruptBlock, TierBlock, decode

SUFFIX = ".kvb"
# shared memory: every worker process of the node (not named like the KV handoff buffers, `fleetctl-kv-…`, there)
HOST_TIER_DIR = Path("/dev/shm/fleetctl-host-tier")
_DISABLING = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EACCES)


def record_path(root: Path, digest: bytes) -> Path:
    """Where a tier rooted at `root` keeps the block `digest`."""
    return root / f"{digest.hex()}{SUFFIX}"


def tier_roots(host_bytes: int, host_dir: Path | None, disk_dir: Path | None,
               disk_bytes: int) -> list[tuple[str, Path, int]]:
    """(name, folder, bound in bytes) of each tier the settings ask for, host memory first, then disk."""
    roots = []
    if host_bytes > 0:
        roots.append(("host", host_dir or HOST_TIER_DIR, host_bytes))
    if disk_dir is not None and disk_bytes > 0:
        roots.append(("disk", disk_dir, disk_bytes))
    return roots


@dataclass
class TierStats:
    """One process's counts for one tier since it opened it (`/metrics` takes their growth), and the tier's
    size as this process last measured it."""

    hits: int = 0
    misses: int = 0
    corrupt: int = 0  # records refused (and deleted) on read
    writes: int = 0
    evictions: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    read_s: float = 0.0  # spent reading and checking the records hit (bytes_read / read_s: the read bandwidth)
    write_s: float = 0.0  # spent writing records (the background writer's time)
    used_bytes: int = 0  # the records the tier held at its last write or eviction scan (every process's)
    used_at: float = 0.0  # when this process measured used_bytes (time.time): the freshest process's count wins
    capacity_bytes: int = 0


@dataclass
class FileTier:
    name: str  # "host" or "disk": how metrics and the console call it
    root: Path
    max_bytes: int
    stats: TierStats = field(default_factory=TierStats)
    disabled: str = ""  # why it turned itself off ("" while it works)

    def __post_init__(self) -> None:
        self._names = itertools.count()
        self._last_ns = 0
        self.stats.capacity_bytes = self.max_bytes
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self._measured(self.usage())
        except OSError as exc:
            self.disabled = f"cannot create {self.root}: {exc.strerror}"

    def path(self, digest: bytes) -> Path:
        return record_path(self.root, digest)

    def get(self, digest: bytes) -> TierBlock | None:
        """The block stored as `digest`, checked; None when it is not here, or is but does not check out."""
        if self.disabled:
            return None
        path = self.path(digest)
        started = time.perf_counter()
        try:
            fault_point("tier-read", self.name)  # stall: a slow disk
            data = path.read_bytes()
            block = decode(data, digest)
        except FileNotFoundError:
            self.stats.misses += 1
            return None
        except (CorruptBlock, OSError):
            self.stats.corrupt += 1
            self.stats.misses += 1
            path.unlink(missing_ok=True)
            return None
        with contextlib.suppress(FileNotFoundError):  # a block evicted meanwhile is still a hit for this read
            self._touch(path)
        self.stats.hits += 1
        self.stats.bytes_read += len(data)
        self.stats.read_s += time.perf_counter() - started
        return block

    def __contains__(self, digest: bytes) -> bool:
        return not self.disabled and self.path(digest).exists()

    def touch(self, digest: bytes) -> bool:
        """Refresh a held block's place in the LRU; False when this tier does not hold it."""
        if self.disabled:
            return False
        try:
            self._touch(self.path(digest))
        except FileNotFoundError:
            return False
        return True

    def put(self, block: TierBlock) -> list[tuple[bytes, bytes]]:
        """Store `block` (one already here is only touched); returns the (digest, record) of each block evicted
        to make room, for a tier below to take."""
        return self.put_record(block.digest, block.encode())

    def put_record(self, digest: bytes, record: bytes) -> list[tuple[bytes, bytes]]:
        """`put` of an encoded record (a block another tier evicted: it is checked again when read)."""
        if self.disabled or len(record) > self.max_bytes:
            return []
        path = self.path(digest)
        if path.exists():
            with contextlib.suppress(FileNotFoundError):
                self._touch(path)
            return []
        scratch = self._scratch(digest)
        started = time.perf_counter()
        try:
            fault_point("tier-write", self.name)
            with open(scratch, "wb") as out:
                out.write(record)
            self._touch(scratch)
            os.replace(scratch, path)
        except OSError as exc:
            scratch.unlink(missing_ok=True)
            if exc.errno in _DISABLING:
                self.disabled = f"writing {self.root} failed: {exc.strerror}: the {self.name} tier is off"
            return []
        self.stats.writes += 1
        self.stats.bytes_written += len(record)
        self.stats.write_s += time.perf_counter() - started
        return self._evict_to_bound(keep=path)

    def usage(self) -> int:
        """Bytes of the records this tier holds now."""
        return sum(size for _, size, _ in self._records())

    def _measured(self, used_bytes: int) -> None:
        self.stats.used_bytes, self.stats.used_at = used_bytes, time.time()

    def _touch(self, path: Path) -> None:
        """Recency for the LRU: the file's mtime set from the nanosecond clock (the kernel stamps files from a
        coarse one, a few milliseconds a tick, which would leave blocks written together in no order)."""
        self._last_ns = max(time.time_ns(), self._last_ns + 1)
        os.utime(path, ns=(self._last_ns, self._last_ns))

    def _scratch(self, digest: bytes) -> Path:
        """A file name of this process's own, beside the records (a rename within one folder is atomic)."""
        return self.root / f".{digest.hex()}.{os.getpid()}.{next(self._names)}.tmp"

    def _records(self) -> list[tuple[int, int, Path]]:
        found = []
        for entry in os.scandir(self.root):
            if entry.name.endswith(SUFFIX):
                try:
                    info = entry.stat()
                except FileNotFoundError:  # evicted by another process meanwhile
                    continue
                found.append((info.st_mtime_ns, info.st_size, Path(entry.path)))
        return found

    def _evict_to_bound(self, keep: Path) -> list[tuple[bytes, bytes]]:
        """Oldest first until the tier fits its bound. Each victim is claimed by a rename first, so that of two
        processes evicting at once only one hands a block down."""
        records = sorted(self._records())
        total = sum(size for _, size, _ in records)
        evicted = []
        for _, size, path in records:
            if total <= self.max_bytes:
                break
            if path == keep:
                continue
            total -= size
            digest = bytes.fromhex(path.name.removesuffix(SUFFIX))
            claimed = self._scratch(digest)
            try:
                os.replace(path, claimed)
                evicted.append((digest, claimed.read_bytes()))
            except FileNotFoundError:  # another process evicted it first
                continue
            finally:
                claimed.unlink(missing_ok=True)
        self.stats.evictions += len(evicted)
        self._measured(total)
        return evicted
