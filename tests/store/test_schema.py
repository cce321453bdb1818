"""The store's file: pragmas, the layout the record types make, and migration from versions 1, 2 and 3."""

import sqlite3

import pytest

from fleetctl.store.db import open_db
from fleetctl.store.errors import StoreVersionError
from fleetctl.store.migrations import MIGRATIONS
from fleetctl.store.records import RECORD_TYPES, SCHEMA_VERSION, columns, schema_version
from fleetctl.store.schema import TABLES

# A version-1 file as the first layout wrote it: worker_samples and gpu_samples had no interval_s.
V1_DDL = """
CREATE TABLE devices (identity VARCHAR NOT NULL, dtype VARCHAR NOT NULL, kind VARCHAR NOT NULL, name VARCHAR NOT NULL,
  driver VARCHAR, peak_flops FLOAT NOT NULL, peak_bytes_per_s FLOAT NOT NULL, how_measured VARCHAR NOT NULL,
  measured_at FLOAT NOT NULL, PRIMARY KEY (identity, dtype));
CREATE TABLE workers (id VARCHAR NOT NULL, role VARCHAR NOT NULL, device VARCHAR NOT NULL, pid INTEGER,
  state VARCHAR NOT NULL, started_at FLOAT NOT NULL, stopped_at FLOAT, PRIMARY KEY (id));
CREATE TABLE worker_samples (id INTEGER NOT NULL, ts FLOAT NOT NULL, worker_id VARCHAR NOT NULL, role VARCHAR NOT NULL,
  busy FLOAT NOT NULL, steps INTEGER NOT NULL, prefill_tokens INTEGER NOT NULL, decode_tokens INTEGER NOT NULL,
  flops INTEGER NOT NULL, bytes INTEGER NOT NULL, mfu FLOAT NOT NULL, mbu FLOAT NOT NULL, batch_size FLOAT NOT NULL,
  kv_usage FLOAT NOT NULL, queue FLOAT NOT NULL, PRIMARY KEY (id));
CREATE INDEX ix_worker_samples_worker_ts ON worker_samples (worker_id, ts);
CREATE INDEX ix_worker_samples_ts ON worker_samples (ts);
CREATE TABLE gpu_samples (id INTEGER NOT NULL, ts FLOAT NOT NULL, device_index INTEGER NOT NULL,
  sm_util FLOAT NOT NULL, mem_util FLOAT NOT NULL, mem_used_bytes INTEGER NOT NULL, power_w FLOAT, PRIMARY KEY (id));
CREATE INDEX ix_gpu_samples_device_ts ON gpu_samples (device_index, ts);
CREATE INDEX ix_gpu_samples_ts ON gpu_samples (ts);
CREATE TABLE requests (request_id VARCHAR NOT NULL, ts FLOAT NOT NULL, queue_s FLOAT NOT NULL, prefill_s FLOAT NOT NULL,
  handoff_bytes INTEGER NOT NULL, handoff_s FLOAT NOT NULL, ttft_s FLOAT NOT NULL, decode_s FLOAT NOT NULL,
  e2e_s FLOAT NOT NULL, prompt_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, prefill_worker VARCHAR,
  decode_worker VARCHAR, outcome VARCHAR NOT NULL, prefill_model_s FLOAT NOT NULL, decode_model_s FLOAT NOT NULL,
  PRIMARY KEY (request_id));
CREATE INDEX ix_requests_ts ON requests (ts);
CREATE TABLE events (id INTEGER NOT NULL, ts FLOAT NOT NULL, kind VARCHAR NOT NULL, worker_id VARCHAR,
  details VARCHAR NOT NULL, PRIMARY KEY (id));
CREATE INDEX ix_events_ts ON events (ts);
CREATE INDEX ix_events_worker_id ON events (worker_id);
CREATE TABLE bench_runs (id INTEGER NOT NULL, ts FLOAT NOT NULL, trace VARCHAR NOT NULL, config VARCHAR NOT NULL,
  results VARCHAR NOT NULL, PRIMARY KEY (id));
CREATE INDEX ix_bench_runs_ts ON bench_runs (ts);
PRAGMA user_version = 1;
"""


# What version 2 created, written out so that a change to a record type or to `schema.py` that alters the
# file shows up here (V3_DDL below is what this schema must create; upgrades are compared with a fresh file).
V2_DDL = """
CREATE TABLE devices (identity VARCHAR NOT NULL, dtype VARCHAR NOT NULL, kind VARCHAR NOT NULL, name VARCHAR NOT NULL,
  driver VARCHAR, peak_flops FLOAT NOT NULL, peak_bytes_per_s FLOAT NOT NULL, how_measured VARCHAR NOT NULL,
  measured_at FLOAT NOT NULL, PRIMARY KEY (identity, dtype));
CREATE TABLE workers (id VARCHAR NOT NULL, role VARCHAR NOT NULL, device VARCHAR NOT NULL, pid INTEGER,
  state VARCHAR NOT NULL, started_at FLOAT NOT NULL, stopped_at FLOAT, PRIMARY KEY (id));
CREATE TABLE worker_samples (id INTEGER NOT NULL, ts FLOAT NOT NULL, worker_id VARCHAR NOT NULL, role VARCHAR NOT NULL,
  interval_s FLOAT DEFAULT '1.0' NOT NULL, busy FLOAT NOT NULL, steps INTEGER NOT NULL, prefill_tokens INTEGER NOT NULL,
  decode_tokens INTEGER NOT NULL, flops INTEGER NOT NULL, bytes INTEGER NOT NULL, mfu FLOAT NOT NULL,
  mbu FLOAT NOT NULL, batch_size FLOAT NOT NULL, kv_usage FLOAT NOT NULL, queue FLOAT NOT NULL, PRIMARY KEY (id));
CREATE INDEX ix_worker_samples_worker_ts ON worker_samples (worker_id, ts, interval_s, steps, busy, mfu, mbu,
  prefill_tokens, decode_tokens, queue, batch_size, kv_usage);
CREATE INDEX ix_worker_samples_ts ON worker_samples (ts);
CREATE TABLE gpu_samples (id INTEGER NOT NULL, ts FLOAT NOT NULL, device_index INTEGER NOT NULL,
  interval_s FLOAT DEFAULT '1.0' NOT NULL, sm_util FLOAT NOT NULL, mem_util FLOAT NOT NULL,
  mem_used_bytes INTEGER NOT NULL, power_w FLOAT, PRIMARY KEY (id));
CREATE INDEX ix_gpu_samples_device_ts ON gpu_samples (device_index, ts);
CREATE INDEX ix_gpu_samples_ts ON gpu_samples (ts);
CREATE TABLE requests (request_id VARCHAR NOT NULL, ts FLOAT NOT NULL, queue_s FLOAT NOT NULL, prefill_s FLOAT NOT NULL,
  handoff_bytes INTEGER NOT NULL, handoff_s FLOAT NOT NULL, ttft_s FLOAT NOT NULL, decode_s FLOAT NOT NULL,
  e2e_s FLOAT NOT NULL, prompt_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, prefill_worker VARCHAR,
  decode_worker VARCHAR, outcome VARCHAR NOT NULL, prefill_model_s FLOAT NOT NULL, decode_model_s FLOAT NOT NULL,
  PRIMARY KEY (request_id));
CREATE INDEX ix_requests_ts ON requests (ts);
CREATE TABLE events (id INTEGER NOT NULL, ts FLOAT NOT NULL, kind VARCHAR NOT NULL, worker_id VARCHAR,
  details VARCHAR NOT NULL, PRIMARY KEY (id));
CREATE INDEX ix_events_ts ON events (ts);
CREATE INDEX ix_events_worker_id ON events (worker_id);
CREATE TABLE bench_runs (id INTEGER NOT NULL, ts FLOAT NOT NULL, trace VARCHAR NOT NULL, config VARCHAR NOT NULL,
  results VARCHAR NOT NULL, PRIMARY KEY (id));
CREATE INDEX ix_bench_runs_ts ON bench_runs (ts);
PRAGMA user_version = 2;
"""

# Version 3 added the prefix cache's columns to requests.
V3_DDL = V2_DDL.replace(
    "decode_model_s FLOAT NOT NULL,\n  PRIMARY KEY (request_id));",
    "decode_model_s FLOAT NOT NULL,\n  prefill_cached_tokens INTEGER DEFAULT '0' NOT NULL, prefill_computed_tokens "
    "INTEGER DEFAULT '0' NOT NULL,\n  local_prefill INTEGER DEFAULT '0' NOT NULL, PRIMARY KEY (request_id));",
).replace("PRAGMA user_version = 2;", "PRAGMA user_version = 3;")

# Version 4 added what the KV tiers served.
V4_DDL = V3_DDL.replace(
    "local_prefill INTEGER DEFAULT '0' NOT NULL, PRIMARY KEY (request_id));",
    "local_prefill INTEGER DEFAULT '0' NOT NULL, host_tier_tokens INTEGER DEFAULT '0' NOT NULL,\n  disk_tier_tokens "
    "INTEGER DEFAULT '0' NOT NULL, PRIMARY KEY (request_id));",
).replace("PRAGMA user_version = 3;", "PRAGMA user_version = 4;")

# Tables whose records have no natural key get a leading INTEGER `id`.
SURROGATE_KEYED = {"worker_samples", "gpu_samples", "events", "bench_runs"}


def layout(conn: sqlite3.Connection) -> dict[str, object]:
    """Each table's columns (name, type, not-null, default, pk) and indexes (name, unique, columns),
    order-insensitive."""
    result: dict[str, object] = {}
    for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
        cols = {(r[1], r[2], r[3], r[4], r[5]) for r in conn.execute(f"PRAGMA table_info({table})")}
        indexes = {
            (r[1], r[2], tuple(c[2] for c in conn.execute(f"PRAGMA index_info({r[1]})")))
            for r in conn.execute(f"PRAGMA index_list({table})")
        }
        result[table] = (cols, indexes)
    return result


def test_fresh_store_pragmas(tmp_path):
    db = open_db(tmp_path / "sub" / "fleet.db")
    assert schema_version(db.conn) == SCHEMA_VERSION
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    assert db.execute("PRAGMA busy_timeout").fetchone()[0] >= 1000
    assert set(db.table_names()) == {t.name for t in TABLES}
    assert "ix_worker_samples_worker_ts" in {i.name for i in db["worker_samples"].indexes}
    db.close()


def test_fresh_layout_is_v4(tmp_path):
    assert V4_DDL.count("DEFAULT '0'") == 5
    expected = sqlite3.connect(tmp_path / "expected.db")
    expected.executescript(V4_DDL)
    db = open_db(tmp_path / "fleet.db")
    assert layout(db.conn) == layout(expected)
    db.close()
    expected.close()


def test_tables_hold_exactly_the_record_columns(tmp_path):
    """A field added to a record is a column of its table, in field order, after any surrogate key."""
    assert {t.name for t in TABLES} == {t.TABLE for t in RECORD_TYPES}
    db = open_db(tmp_path / "fleet.db")
    for record_type in RECORD_TYPES:
        key = ["id"] if record_type.TABLE in SURROGATE_KEYED else []
        assert [c.name for c in db[record_type.TABLE].columns] == [*key, *columns(record_type)], record_type.__name__
    db.close()


def _upgraded(tmp_path, ddl: str, *inserts: str):
    """A file made by an older schema's `ddl` holding `inserts`, opened (and so upgraded): the open store, checked to
    be at the current version and laid out exactly as a fresh file."""
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(ddl)
    for insert in inserts:
        conn.execute(insert)
    conn.commit()
    conn.close()
    db = open_db(path)
    assert schema_version(db.conn) == SCHEMA_VERSION
    fresh = open_db(tmp_path / "fresh.db")
    assert layout(db.conn) == layout(fresh.conn)
    fresh.close()
    return db


def test_v1_file_is_upgraded_in_place(tmp_path):
    assert len(MIGRATIONS) == SCHEMA_VERSION - 1  # one step per version after the first
    db = _upgraded(
        tmp_path, V1_DDL,
        "INSERT INTO worker_samples (ts, worker_id, role, busy, steps, prefill_tokens, decode_tokens, flops, bytes, "
        "mfu, mbu, batch_size, kv_usage, queue) VALUES (100, 'decode-0', 'decode', 0.5, 3, 0, 24, 7, 9, 0.1, 0.2, "
        "8, 0.3, 1)",
        "INSERT INTO gpu_samples (ts, device_index, sm_util, mem_util, mem_used_bytes) VALUES (1, 0, 0.5, 0.4, 9)")
    row = next(db.query("SELECT * FROM worker_samples"))
    assert row["interval_s"] == 1.0 and row["decode_tokens"] == 24 and row["flops"] == 7
    assert next(db.query("SELECT interval_s FROM gpu_samples"))["interval_s"] == 1.0
    db.close()


def test_v2_file_gets_the_prefix_cache_columns(tmp_path):
    db = _upgraded(
        tmp_path, V2_DDL,
        "INSERT INTO requests (request_id, ts, queue_s, prefill_s, handoff_bytes, handoff_s, ttft_s, decode_s, e2e_s, "
        "prompt_tokens, output_tokens, outcome, prefill_model_s, decode_model_s) VALUES ('r', 1, 0, 0.1, 0, 0, 0.1, "
        "1, 1.1, 40, 8, 'ok', 0.1, 1)")
    row = next(db.query("SELECT * FROM requests"))
    assert (row["prompt_tokens"], row["prefill_cached_tokens"], row["prefill_computed_tokens"],
            row["local_prefill"]) == (40, 0, 0, 0)
    db.close()


def test_newer_file_is_refused(tmp_path):
    path = tmp_path / "future.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreVersionError, match="schema version"):
        open_db(path)


def test_v3_file_gets_the_tier_columns(tmp_path):
    db = _upgraded(
        tmp_path, V3_DDL,
        "INSERT INTO requests (request_id, ts, queue_s, prefill_s, handoff_bytes, handoff_s, ttft_s, decode_s, e2e_s, "
        "prompt_tokens, output_tokens, outcome, prefill_model_s, decode_model_s, prefill_cached_tokens) VALUES ('r', "
        "1, 0, 0.1, 0, 0, 0.1, 1, 1.1, 40, 8, 'ok', 0.1, 1, 32)")
    row = next(db.query("SELECT * FROM requests"))
    assert (row["prefill_cached_tokens"], row["host_tier_tokens"], row["disk_tier_tokens"]) == (32, 0, 0)
    db.close()
