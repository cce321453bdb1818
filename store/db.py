"""The store's file: opened in WAL mode, created at the current schema version from `schema.py` or
stepped up from an older one. `PRAGMA user_version` holds the file's version.

Version history:
  1. the first layout: every table, samples always 1 s long.
  2. retention: `interval_s` on worker_samples and gpu_samples (1 s raw, 10 s downsampled rows);
     the (worker_id, ts) index extended to cover the columns the utilization queries sum.
  3. prefix caching: `prefill_cached_tokens`, `prefill_computed_tokens` and `local_prefill` on requests.
  4. KV tiers: `host_tier_tokens` and `disk_tier_tokens` on requests (of the cached tokens, what each tier served).
"""

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from sqlalchemy.exc import DBAPIError
from sqlite_utils import Database
from sqlmodel import SQLModel, create_engine

from fleetctl.store.errors import StoreVersionError, diagnose, store_file_errors
from fleetctl.store.schema import (
    REQUEST_PREFIX_DEFAULTS,
    REQUEST_TIER_DEFAULTS,
    SCHEMA_VERSION,
    TABLES,
    WORKER_INDEX_COLUMNS,
)

BUSY_TIMEOUT_S = 10.0
Answer = TypeVar("Answer")


def open_db(path: Path | str, *, check_same_thread: bool = True) -> Database:
    """Open the store at `path` (created if missing, upgraded if older); StoreFileError says what is wrong with a
    file that cannot be (not a database, a newer schema, read-only, a full disk).

    WAL lets the console read while the fleet writes; synchronous=NORMAL is durable across a
    process crash (not a power cut) at a fraction of FULL's fsyncs; the busy timeout makes a second
    writer (retention, the device cache) wait instead of failing. The connection is in autocommit
    mode: writes that must be atomic open their own transaction.
    """
    path = Path(path)
    with store_file_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                               check_same_thread=check_same_thread)
        try:
            if schema_version(conn) != SCHEMA_VERSION:
                upgrade(path)
            conn.execute("PRAGMA synchronous=NORMAL")
        except DBAPIError as exc:  # SQLAlchemy's wrapping of sqlite's error, from creating the tables
            conn.close()
            raise diagnose(path, exc.orig) from exc
        except BaseException:
            conn.close()
            raise
    return Database(conn)


def move_aside(path: Path) -> Path:
    """Rename the store at `path` (and its WAL files) to `<name>.corrupt-<UTC time>`; returns the new name."""
    aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
    for suffix in ("", "-wal", "-shm"):
        companion = Path(f"{path}{suffix}")
        if companion.exists():
            companion.rename(f"{aside}{suffix}")
    return aside


def read_store(path: Path | str, query: Callable[[Database], Answer]) -> Answer:
    """`query` on the store at `path` over a connection of its own, opened and closed in the calling thread (a
    server's worker thread: reads never wait on the event loop)."""
    db = open_db(path)
    try:
        return query(db)
    finally:
        db.close()


def schema_version(conn: sqlite3.Connection) -> int:
    return conn.execute("PRAGMA user_version").fetchone()[0]


def _v1_to_v2(conn: sqlite3.Connection) -> None:
    for table in ("worker_samples", "gpu_samples"):
        conn.execute(f"ALTER TABLE {table} ADD COLUMN interval_s FLOAT DEFAULT '1.0' NOT NULL")
    conn.execute("DROP INDEX ix_worker_samples_worker_ts")
    conn.execute(f"CREATE INDEX ix_worker_samples_worker_ts ON worker_samples ({', '.join(WORKER_INDEX_COLUMNS)})")


def _request_columns(defaults: dict[str, str]) -> Callable[[sqlite3.Connection], None]:
    """A step that adds integer columns with these defaults to requests."""
    def add(conn: sqlite3.Connection) -> None:
        for column, default in defaults.items():
            conn.execute(f"ALTER TABLE requests ADD COLUMN {column} INTEGER DEFAULT '{default}' NOT NULL")
    return add


# MIGRATIONS[n - 1] takes a file from version n to n + 1.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [
    _v1_to_v2, _request_columns(REQUEST_PREFIX_DEFAULTS), _request_columns(REQUEST_TIER_DEFAULTS)]


def upgrade(path: Path) -> int:
    """Create or upgrade the file at `path` to SCHEMA_VERSION in one write transaction, so that two
    processes opening a fresh store at once cannot both create it. Returns the version found."""
    # Driver-level autocommit: the BEGIN IMMEDIATE below is the only transaction.
    engine = create_engine(f"sqlite:///{path}", connect_args={"isolation_level": None, "timeout": BUSY_TIMEOUT_S})
    try:
        with engine.connect() as conn:
            raw: sqlite3.Connection = conn.connection.driver_connection  # type: ignore[assignment]
            raw.execute("PRAGMA journal_mode=WAL")  # persistent in the file; cannot run in a transaction
            raw.execute("BEGIN IMMEDIATE")
            try:
                found = schema_version(raw)
                if found > SCHEMA_VERSION:
                    raise StoreVersionError(path, found, SCHEMA_VERSION)
                if found == 0:
                    SQLModel.metadata.create_all(conn, tables=TABLES)
                else:
                    for step in MIGRATIONS[found - 1 :]:
                        step(raw)
                raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                raw.execute("COMMIT")
            except BaseException:
                raw.execute("ROLLBACK")
                raise
    finally:
        engine.dispose()
    return found
