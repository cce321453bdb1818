"""The fleet controller's batched writer: records are validated and queued by the caller, and a
background thread writes whatever is queued once a second (or sooner when a batch is large), one
transaction per flush, with sqlite-utils' `insert_all`. It also runs retention every minute.

A record that fails validation, or a worker sample for a worker the store has never seen, is
rejected: counted, logged (the 1st, 2nd, 4th, 8th, … of each table), and dropped. A write that
fails for its rows' sake (a constraint) loses that table's rows of that flush and is logged. A
write the file itself refuses (a full disk, an I/O error, a read-only volume: sqlite's
OperationalError) keeps the whole flush queued, up to `max_pending_rows` (rows beyond it are
dropped and counted), and is tried again each flush: the writer reports itself failing (`health`) until a
write succeeds. Nothing the fleet serves ever waits on the store.
"""

import logging
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from fleetctl.store.db import open_db
from fleetctl.store.errors import StoreFileError, diagnose
from fleetctl.store.records import ROW_GETTERS, DeviceRecord, Record, WorkerRecord, WorkerSample, columns
from fleetctl.store.retention import RetentionConfig, apply_retention
from fleetctl.store.validate import problem

log = logging.getLogger(__name__)

_REPLACED = (DeviceRecord, WorkerRecord)  # rows keyed by identity: a newer record replaces the older


@dataclass(frozen=True)
class WriterConfig:
    flush_interval_s: float = 1.0
    batch_rows: int = 5000  # flush early once this many rows are queued
    max_pending_rows: int = 500_000  # beyond this, new rows are dropped: the disk is not keeping up
    retention: RetentionConfig | None = field(default_factory=RetentionConfig)
    retention_interval_s: float = 60.0

    def __post_init__(self) -> None:
        if self.flush_interval_s <= 0 or self.retention_interval_s <= 0:
            raise ValueError("flush_interval_s and retention_interval_s must be positive")
        if not 0 < self.batch_rows <= self.max_pending_rows:
            raise ValueError("need 0 < batch_rows <= max_pending_rows")


@dataclass(frozen=True)
class StoreFailure:
    """The store refusing writes: since when (time.time()), what (StoreProblem's words) and why (one line naming
    the file and what to do), and the rows kept."""

    since: float
    problem: str
    error: str
    kept_rows: int


@dataclass(frozen=True)
class WriterStats:
    written: dict[str, int]  # rows per table
    rejected: dict[str, int]  # failed validation or unknown worker
    dropped: dict[str, int]  # queue full, or the write itself failed


class MetricsWriter:
    def __init__(self, db_path: Path | str, config: WriterConfig | None = None) -> None:
        self.config = config or WriterConfig()
        self.path = Path(db_path)
        self._db = open_db(db_path, check_same_thread=False)  # used under _db_lock only
        self._known_workers = {row[0] for row in self._db.execute("SELECT id FROM workers")}
        self._pending: dict[type, list[tuple]] = {}
        self._pending_rows = 0
        self._flushing = 0  # rows taken out for the flush under way (kept, if the file refuses it)
        self._written: Counter[str] = Counter()
        self._rejected: Counter[str] = Counter()
        self._dropped: Counter[str] = Counter()
        self._lock = threading.Lock()  # queue and counters
        self._db_lock = threading.Lock()  # one writer on the connection at a time
        self._wake = threading.Event()
        self._closed = False
        self._retention_since = 0.0
        self._failing: tuple[float, StoreFileError] | None = None  # (since, why) while the file refuses writes
        self._refusals = 0
        self._thread = threading.Thread(target=self._run, name="metrics-writer", daemon=True)
        self._thread.start()

    def add(self, record: Record) -> bool:
        """Queue one record; False when it was rejected or dropped (see `stats`)."""
        table = record.TABLE
        reason = problem(record)
        if reason is None and isinstance(record, WorkerSample) and record.worker_id not in self._known_workers:
            reason = f"unknown worker {record.worker_id!r}"
        with self._lock:
            if self._closed:
                raise RuntimeError("MetricsWriter is closed")
            if reason is not None:
                self._rejected[table] += 1
                count = self._rejected[table]
                if count & (count - 1) == 0:
                    log.warning("metrics store: rejected %s row (%d so far): %s", table, count, reason)
                return False
            if self._pending_rows >= self.config.max_pending_rows:
                self._dropped[table] += 1
                return False
            if isinstance(record, WorkerRecord):
                self._known_workers.add(record.id)
            self._pending.setdefault(type(record), []).append(ROW_GETTERS[type(record)](record))
            self._pending_rows += 1
            if self._pending_rows >= self.config.batch_rows:
                self._wake.set()
        return True

    def add_all(self, records: Iterable[Record]) -> int:
        """Queue several records; returns how many were accepted."""
        return sum(self.add(record) for record in records)

    def flush(self) -> int:
        """Write everything queued so far, in one transaction. Returns the rows written."""
        with self._db_lock:
            with self._lock:
                batch, self._pending, self._flushing, self._pending_rows = self._pending, {}, self._pending_rows, 0
            if not batch:
                return 0
            written: Counter[str] = Counter()
            failed: Counter[str] = Counter()
            try:
                with self._db.atomic():
                    for record_type, rows in batch.items():
                        # a savepoint per table: a table whose rows fail loses them, not the whole flush
                        try:
                            with self._db.atomic():
                                self._db[record_type.TABLE].insert_all(
                                    [list(columns(record_type)), *rows],
                                    replace=record_type in _REPLACED,
                                    batch_size=1000,
                                )
                            written[record_type.TABLE] += len(rows)
                        except sqlite3.OperationalError:
                            raise  # the file, not these rows: the whole flush waits for it
                        except sqlite3.Error:
                            log.exception("metrics store: writing %d %s rows failed", len(rows), record_type.TABLE)
                            failed[record_type.TABLE] += len(rows)
            except sqlite3.OperationalError as exc:
                self._keep(batch, exc)
                return 0
            except sqlite3.Error:  # the commit itself failed
                log.exception("metrics store: flush of %d rows failed", written.total())
                failed.update(written)
                written.clear()
            with self._lock:
                self._written.update(written)
                self._dropped.update(failed)
                recovered, self._failing, self._refusals, self._flushing = self._failing, None, 0, 0
            if recovered:
                log.warning("metrics store %s: writing again after %.0f s", self.path, time.time() - recovered[0])
            return written.total()

    def _keep(self, batch: dict[type, list[tuple]], exc: sqlite3.OperationalError) -> None:
        """The file refused the flush: queue its rows again, ahead of what came since, up to the cap."""
        why = diagnose(self.path, exc)
        with self._lock:
            for record_type, rows in batch.items():
                self._pending[record_type] = rows + self._pending.get(record_type, [])
                self._pending_rows += len(rows)
            self._flushing = 0
            self._drop_oldest_beyond_cap()
            self._failing = (self._failing[0] if self._failing else time.time(), why)
            self._refusals += 1
            refusals, kept = self._refusals, self._pending_rows
        if refusals & (refusals - 1) == 0:
            log.warning("metrics store: %s (%d rows kept, refusal %d)", why, kept, refusals)

    def _drop_oldest_beyond_cap(self) -> None:
        while self._pending_rows > self.config.max_pending_rows:
            record_type, rows = max(self._pending.items(), key=lambda item: len(item[1]))
            excess = min(len(rows), self._pending_rows - self.config.max_pending_rows)
            del rows[:excess]
            self._pending_rows -= excess
            self._dropped[record_type.TABLE] += excess

    @property
    def health(self) -> StoreFailure | None:
        """None while writes succeed; else since when and why the store refuses them, and the rows kept."""
        with self._lock:
            if self._failing is None:
                return None
            since, why = self._failing
            return StoreFailure(since=since, problem=why.problem.value, error=str(why),
                                kept_rows=self._pending_rows + self._flushing)

    def run_retention(self, now: float | None = None) -> None:
        if self.config.retention is None:
            return
        with self._db_lock:
            result = apply_retention(self._db, self.config.retention, now, since=self._retention_since)
        self._retention_since = result.cutoff
        if result.merged_rows or result.deleted_rows:
            log.info("metrics store retention: %s", result)

    @property
    def stats(self) -> WriterStats:
        with self._lock:
            return WriterStats(dict(self._written), dict(self._rejected), dict(self._dropped))

    def close(self) -> None:
        """Write what is queued and stop the thread. Records added afterwards raise."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake.set()
        self._thread.join()
        self.flush()
        self._db.close()
        if (failure := self.health) is not None:
            log.warning("metrics store: %d rows were never written: %s", failure.kept_rows, failure.error)

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _run(self) -> None:
        next_retention = time.monotonic()
        while True:
            self._wake.wait(self.config.flush_interval_s)
            self._wake.clear()
            if self._closed:
                return
            try:
                self.flush()
                if time.monotonic() >= next_retention:
                    next_retention = time.monotonic() + self.config.retention_interval_s
                    self.run_retention()
            except Exception:  # the writer thread outlives any one bad flush
                log.exception("metrics store: writer thread error")
