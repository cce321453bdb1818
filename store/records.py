"""What the store holds, one frozen record type per table; the vocabularies their columns use are the
domain's (`fleetctl.domain`).

Records are plain slotted dataclasses rather than SQLModel instances: building a SQLModel table
object costs ~30 µs, which alone would cap the writer near the 20,000 samples/s it must sustain.
They are also the one declaration of the store's columns: `schema.py` builds each table from its
record type's fields (names, types, `X | None` for nullable), adding only keys and indexes.
"""

import sqlite3
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import ClassVar

from fleetctl.domain import DeviceKind, EventKind, PeakSource, RequestOutcome, WorkerRole, WorkerState

SCHEMA_VERSION = 4  # the layout these records make (`PRAGMA user_version`; migrations.py steps older files up)


def schema_version(conn: sqlite3.Connection) -> int:
    """The layout version a store's file says it has (0: a new file)."""
    return conn.execute("PRAGMA user_version").fetchone()[0]


@dataclass(frozen=True, slots=True)
class DeviceRecord:
    """Peak compute and bandwidth of one device identity at one dtype (the calibration cache)."""

    TABLE: ClassVar[str] = "devices"
    identity: str  # e.g. "cuda:NVIDIA H200", "cpu:AMD EPYC 7B13:2threads"
    dtype: str  # "bfloat16", "float32", …
    kind: DeviceKind
    name: str
    driver: str | None
    peak_flops: float
    peak_bytes_per_s: float
    how_measured: PeakSource
    measured_at: float  # unix seconds


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    """A worker's current row; writing it again replaces the previous one (state changes)."""

    TABLE: ClassVar[str] = "workers"
    id: str  # "prefill-0", "decode-1", "mixed-0"
    role: WorkerRole
    device: str  # "cuda:0", "cpu:1"
    pid: int | None
    state: WorkerState
    started_at: float
    stopped_at: float | None = None


@dataclass(frozen=True, slots=True)
class WorkerSample:
    """One worker over one interval (1 s raw, 10 s once downsampled). Starts at `ts`.

    busy, mfu and mbu are over the interval's wall time: mfu = flops / interval_s / peak_flops,
    so mfu / busy is the model's FLOP rate while the worker was actually stepping.
    """

    TABLE: ClassVar[str] = "worker_samples"
    ts: float
    worker_id: str
    role: WorkerRole
    interval_s: float
    busy: float  # fraction of the interval spent in model steps, 0..1
    steps: int
    prefill_tokens: int
    decode_tokens: int
    flops: int
    bytes: int
    mfu: float
    mbu: float
    batch_size: float  # mean running sequences per step
    kv_usage: float  # fraction of the KV pool in use, 0..1
    queue: float  # requests waiting for admission


@dataclass(frozen=True, slots=True)
class GpuSample:
    """pynvml's view of one GPU over one interval (1 s raw, 10 s once downsampled)."""

    TABLE: ClassVar[str] = "gpu_samples"
    ts: float
    device_index: int
    interval_s: float
    sm_util: float  # fraction of time a kernel was running, 0..1
    mem_util: float  # fraction of time device memory was read or written, 0..1
    mem_used_bytes: int
    power_w: float | None  # None where the board does not report power


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One finished request. `*_model_s` is the request's share of its workers' busy time: each
    step's seconds divided among the step's sequences in proportion to their tokens in it. This,
    not the wall-clock phase latency, is what `classify` sums (a decode step batched with 31 other
    sequences costs each of them 1/32 of the step)."""

    TABLE: ClassVar[str] = "requests"
    request_id: str
    ts: float  # arrival
    queue_s: float
    prefill_s: float
    handoff_bytes: int
    handoff_s: float
    ttft_s: float
    decode_s: float
    e2e_s: float
    prompt_tokens: int
    output_tokens: int
    prefill_worker: str | None
    decode_worker: str | None
    outcome: RequestOutcome
    prefill_model_s: float
    decode_model_s: float
    prefill_cached_tokens: int = 0  # prompt tokens its prefill took from a prefix cache (cost no model time)
    prefill_computed_tokens: int = 0  # tokens its prefill steps computed
    local_prefill: int = 0  # 1: its decode worker prefilled it (conditional disaggregation), no handoff
    host_tier_tokens: int = 0  # of the cached tokens, what the host-memory KV tier served (read back)
    disk_tier_tokens: int = 0  # and what the disk tier served


@dataclass(frozen=True, slots=True)
class EventRecord:
    TABLE: ClassVar[str] = "events"
    ts: float
    kind: EventKind
    worker_id: str | None
    details: dict[str, object] = field(default_factory=dict)  # stored as JSON text


@dataclass(frozen=True, slots=True)
class BenchRun:
    TABLE: ClassVar[str] = "bench_runs"
    ts: float
    trace: str
    config: dict[str, object]  # stored as JSON text
    results: dict[str, object]  # stored as JSON text


Record = DeviceRecord | WorkerRecord | WorkerSample | GpuSample | RequestRecord | EventRecord | BenchRun
RECORD_TYPES: tuple[type[Record], ...] = (
    DeviceRecord, WorkerRecord, WorkerSample, GpuSample, RequestRecord, EventRecord, BenchRun,
)


def columns(record_type: type[Record]) -> tuple[str, ...]:
    return tuple(f.name for f in fields(record_type))


ROW_GETTERS = {t: attrgetter(*columns(t)) for t in RECORD_TYPES}  # record -> tuple in column order
