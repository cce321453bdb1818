"""Stepping a store's file up to the current schema version (`records.SCHEMA_VERSION`), or creating it there from
`schema.py`'s tables, in one write transaction. Imported only when a file needs it: it brings SQLAlchemy.

Version history:
  1. the first layout: every table, samples always 1 s long.
  2. retention: `interval_s` on worker_samples and gpu_samples (1 s raw, 10 s downsampled rows);
     the (worker_id, ts) index extended to cover the columns the utilization queries sum.
  3. prefix caching: `prefill_cached_tokens`, `prefill_computed_tokens` and `local_prefill` on requests.
  4. KV tiers: `host_tier_tokens` and `disk_tier_tokens` on requests (of the cached tokens, what each tier served).
"""

import sqlite3
from collections.abc import Callable
from pathlib import Path

from sqlalchemy.exc import DBAPIError
from sqlmodel import SQLModel, create_engine

from fleetctl.store.errors import StoreVersionError, diagnose
from fleetctl.store.records import SCHEMA_VERSION, schema_version
from fleetctl.store.schema import REQUEST_PREFIX_DEFAULTS, REQUEST_TIER_DEFAULTS, TABLES, WORKER_INDEX_COLUMNS


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


def upgrade(path: Path, busy_timeout_s: float) -> int:
    """Create or upgrade the file at `path` to SCHEMA_VERSION in one write transaction, so that two
    processes opening a fresh store at once cannot both create it. Returns the version found."""
    try:
        return _upgrade(path, busy_timeout_s)
    except DBAPIError as exc:  # SQLAlchemy's wrapping of sqlite's error, from creating the tables
        raise diagnose(path, exc.orig) from exc


def _upgrade(path: Path, busy_timeout_s: float) -> int:
    # Driver-level autocommit: the BEGIN IMMEDIATE below is the only transaction.
    engine = create_engine(f"sqlite:///{path}", connect_args={"isolation_level": None, "timeout": busy_timeout_s})
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
