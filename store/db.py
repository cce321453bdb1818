"""Opening the metrics store: one SQLite file in WAL mode, created or upgraded on open."""

import sqlite3
from pathlib import Path

from fleetctl.store.migrations import BUSY_TIMEOUT_S, upgrade
from fleetctl.store.schema import SCHEMA_VERSION
from sqlite_utils import Database


def open_db(path: Path | str, *, check_same_thread: bool = True) -> Database:
    """Open the store at `path` (created if missing, upgraded if older).

    WAL lets the console read while the fleet writes; synchronous=NORMAL is durable across a
    process crash (not a power cut) at a fraction of FULL's fsyncs; the busy timeout makes a second
    writer (retention, device cache) wait instead of failing. The connection is in autocommit mode:
    writes that must be atomic open their own transaction.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=check_same_thread)
    if schema_version(conn) != SCHEMA_VERSION:
        upgrade(path)
    conn.execute("PRAGMA synchronous=NORMAL")
    return Database(conn)


def schema_version(conn: sqlite3.Connection) -> int:
    return conn.execute("PRAGMA user_version").fetchone()[0]
