"""The store's tables at the current schema version (SQLModel declarations).

A fresh file is created from these declarations; an older file is brought here by the steps in
`db.py`. Column meanings are documented on the matching record types in `records.py`.
Enum-valued columns are plain text holding the enum's value.
"""

from sqlmodel import Field, Index, SQLModel

SCHEMA_VERSION = 2


class DeviceRow(SQLModel, table=True):
    __tablename__ = "devices"
    identity: str = Field(primary_key=True)
    dtype: str = Field(primary_key=True)
    kind: str
    name: str
    driver: str | None = None
    peak_flops: float
    peak_bytes_per_s: float
    how_measured: str
    measured_at: float


class WorkerRow(SQLModel, table=True):
    __tablename__ = "workers"
    id: str = Field(primary_key=True)
    role: str
    device: str
    pid: int | None = None
    state: str
    started_at: float
    stopped_at: float | None = None


# Every column the utilization queries sum is in the per-worker index, so that they read the index
# alone (an hour of 8 workers at 1 Hz: 14 ms instead of 23 ms here).
WORKER_INDEX_COLUMNS = ("worker_id", "ts", "interval_s", "steps", "busy", "mfu", "mbu", "prefill_tokens",
                        "decode_tokens", "queue", "batch_size", "kv_usage")


class WorkerSampleRow(SQLModel, table=True):
    __tablename__ = "worker_samples"
    __table_args__ = (Index("ix_worker_samples_worker_ts", *WORKER_INDEX_COLUMNS),)
    id: int | None = Field(default=None, primary_key=True)
    ts: float = Field(index=True)
    worker_id: str
    role: str
    interval_s: float = Field(default=1.0, sa_column_kwargs={"server_default": "1.0"})  # since v2
    busy: float
    steps: int
    prefill_tokens: int
    decode_tokens: int
    flops: int  # whole FLOPs, so that downsampling sums exactly
    bytes: int
    mfu: float
    mbu: float
    batch_size: float
    kv_usage: float
    queue: float


class GpuSampleRow(SQLModel, table=True):
    __tablename__ = "gpu_samples"
    __table_args__ = (Index("ix_gpu_samples_device_ts", "device_index", "ts"),)
    id: int | None = Field(default=None, primary_key=True)
    ts: float = Field(index=True)
    device_index: int
    interval_s: float = Field(default=1.0, sa_column_kwargs={"server_default": "1.0"})  # since v2
    sm_util: float
    mem_util: float
    mem_used_bytes: int
    power_w: float | None = None


class RequestRow(SQLModel, table=True):
    __tablename__ = "requests"
    request_id: str = Field(primary_key=True)
    ts: float = Field(index=True)
    queue_s: float
    prefill_s: float
    handoff_bytes: int
    handoff_s: float
    ttft_s: float
    decode_s: float
    e2e_s: float
    prompt_tokens: int
    output_tokens: int
    prefill_worker: str | None = None
    decode_worker: str | None = None
    outcome: str
    prefill_model_s: float
    decode_model_s: float


class EventRow(SQLModel, table=True):
    __tablename__ = "events"
    id: int | None = Field(default=None, primary_key=True)
    ts: float = Field(index=True)
    kind: str
    worker_id: str | None = Field(default=None, index=True)
    details: str  # JSON object


class BenchRunRow(SQLModel, table=True):
    __tablename__ = "bench_runs"
    id: int | None = Field(default=None, primary_key=True)
    ts: float = Field(index=True)
    trace: str
    config: str  # JSON object
    results: str  # JSON object


TABLES = [
    model.__table__  # type: ignore[attr-defined]
    for model in (DeviceRow, WorkerRow, WorkerSampleRow, GpuSampleRow, RequestRow, EventRow, BenchRunRow)
]
