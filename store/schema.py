"""The store's tables at the current schema version, built from the record types in `records.py`.

A record's fields are its table's columns, so each column is declared once, there: `int` is INTEGER,
`float` FLOAT, `str`, enums (their value) and dicts (a JSON object) VARCHAR, and `X | None` nullable.
Only what a record cannot say is added here: the primary key, the indexes and server defaults.

A fresh file is created from these tables; an older file is brought here by the steps in `db.py`.
"""

from types import NoneType, UnionType
from typing import get_args, get_origin, get_type_hints

from sqlalchemy import Column, Float, Index, Integer, String, Table
from sqlalchemy.types import TypeEngine
from sqlmodel import SQLModel

from fleetctl.store.records import (
    BenchRun,
    DeviceRecord,
    EventRecord,
    GpuSample,
    Record,
    RequestRecord,
    WorkerRecord,
    WorkerSample,
    columns,
)

_SURROGATE_KEY = "id"  # INTEGER rowid key of the tables whose records have no natural one

# Every column the utilization queries sum is in the per-worker index, so that they read the index
# alone (an hour of 8 workers at 1 Hz: 14 ms instead of 23 ms here).
WORKER_INDEX_COLUMNS = ("worker_id", "ts", "interval_s", "steps", "busy", "mfu", "mbu", "prefill_tokens",
                        "decode_tokens", "queue", "batch_size", "kv_usage")

# Rows written before version 2 were all 1 s long; the v1 -> v2 step fills the new column with it.
_INTERVAL_DEFAULT = {"interval_s": "1.0"}

# Rows written before version 3 had no prefix cache: nothing cached, computed tokens unknown (0), no local prefill.
REQUEST_PREFIX_DEFAULTS = {"prefill_cached_tokens": "0", "prefill_computed_tokens": "0", "local_prefill": "0"}

# Rows written before version 4 had no KV tiers: none of their cached tokens came from one.
REQUEST_TIER_DEFAULTS = {"host_tier_tokens": "0", "disk_tier_tokens": "0"}

# First match wins; StrEnum is a str subclass.
_SQL_TYPES: tuple[tuple[type, type[TypeEngine]], ...] = ((int, Integer), (float, Float), (str, String), (dict, String))


def _column(name: str, annotation: object, *, primary_key: bool, server_default: str | None) -> Column:
    """The column for a record field annotated `annotation`; any other type raises, rather than guess."""
    nullable = isinstance(annotation, UnionType) and NoneType in get_args(annotation)
    if nullable:
        (annotation,) = (arg for arg in get_args(annotation) if arg is not NoneType)
    python_type = get_origin(annotation) or annotation  # dict[str, object] -> dict
    for base, sql_type in _SQL_TYPES:
        if isinstance(python_type, type) and issubclass(python_type, base):
            return Column(name, sql_type(), primary_key=primary_key, nullable=nullable, server_default=server_default)
    raise TypeError(f"no column type for {name}: {annotation!r}")


def _table(record_type: type[Record], *indexes: Index, key: tuple[str, ...] = (),
           server_defaults: dict[str, str] | None = None) -> Table:
    """`record_type`'s table, keyed by its `key` fields or, without one, by a leading _SURROGATE_KEY."""
    hints = get_type_hints(record_type)
    server_defaults = server_defaults or {}
    surrogate = [] if key else [Column(_SURROGATE_KEY, Integer, primary_key=True)]
    record_columns = [
        _column(name, hints[name], primary_key=name in key, server_default=server_defaults.get(name))
        for name in columns(record_type)
    ]
    return Table(record_type.TABLE, SQLModel.metadata, *surrogate, *record_columns, *indexes)


TABLES = [
    _table(DeviceRecord, key=("identity", "dtype")),
    _table(WorkerRecord, key=("id",)),
    _table(
        WorkerSample,
        Index("ix_worker_samples_ts", "ts"),
        Index("ix_worker_samples_worker_ts", *WORKER_INDEX_COLUMNS),
        server_defaults=_INTERVAL_DEFAULT,
    ),
    _table(
        GpuSample,
        Index("ix_gpu_samples_ts", "ts"),
        Index("ix_gpu_samples_device_ts", "device_index", "ts"),
        server_defaults=_INTERVAL_DEFAULT,
    ),
    _table(RequestRecord, Index("ix_requests_ts", "ts"), key=("request_id",),
           server_defaults=REQUEST_PREFIX_DEFAULTS | REQUEST_TIER_DEFAULTS),
    _table(EventRecord, Index("ix_events_ts", "ts"), Index("ix_events_worker_id", "worker_id")),
    _table(BenchRun, Index("ix_bench_runs_ts", "ts")),
]
