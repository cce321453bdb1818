"""The store's file: opened in WAL mode, created at the current schema version or stepped up from an older one
(`migrations.py`, which holds the version history). `PRAGMA user_version` holds the file's version."""

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from sqlite_utils import Database

from fleetctl.store.errors import store_file_errors
from fleetctl.store.records import SCHEMA_VERSION, schema_version

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
                # imported here: SQLAlchemy takes 0.25 s to import, and a store at the current version (what a
                # console reads) never needs it
                from fleetctl.store.migrations import upgrade

                upgrade(path, BUSY_TIMEOUT_S)
            conn.execute("PRAGMA synchronous=NORMAL")
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
