"""Schema versions: `PRAGMA user_version` holds the file's version; a fresh file is created at the
current version from `schema.py`, an older one is stepped up one version at a time.

Version history:
  1. the first layout: every table, samples always 1 s long.
  2. retention: `interval_s` on worker_samples and gpu_samples (1 s raw, 10 s downsampled rows).
"""

import sqlite3
from collections.abc import Callable
from pathlib import Path

from fleetctl.store.schema import SCHEMA_VERSION, TABLES
from sqlmodel import SQLModel, create_engine

BUSY_TIMEOUT_S = 10.0


class StoreVersionError(RuntimeError):
    """The file was written by a newer fleetctl than this one."""


def _v1_to_v2(conn: sqlite3.Connection) -> None:
    for table in ("worker_samples", "gpu_samples"):
        conn.execute(f"ALTER TABLE {table} ADD COLUMN interval_s FLOAT DEFAULT '1.0' NOT NULL")


# MIGRATIONS[n - 1] takes a file from version n to n + 1.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_v1_to_v2]
assert len(MIGRATIONS) == SCHEMA_VERSION - 1


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
                found = raw.execute("PRAGMA user_version").fetchone()[0]
                if found > SCHEMA_VERSION:
                    raise StoreVersionError(
                        f"{path} has schema version {found}; this fleetctl reads up to {SCHEMA_VERSION}"
                    )
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
