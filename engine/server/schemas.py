"""The `/fleet/*` contract: a pydantic model for every response, so `/openapi.json` describes responses
as well as bodies and the CLI and the console parse the same types. Torch-free. The operations' results
and stages are the fleet's own (`engine/fleet/ops/results.py`, `ops/stages.py`), used here as they are;
`describe` says any operation, done or not, in one sentence for people.

Response models built from the fleet's and the store's dicts allow extra fields (`OpenModel`): a field added
there is passed on, never dropped (fields are added, never renamed). `/fleet/history`'s are in
history_schemas.py."""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fleetctl.engine.fleet.ops.record import Operation, OpKind, OpState
from fleetctl.engine.fleet.ops.results import (
    CheckpointResult,
    DrainResult,
    LiveMigrateResult,
    MoveResult,
    MoveStageDone,
    OperationResult,
    RebalancePreview,
    RebalanceResult,
    RestartResult,
    RestoreResult,
    ResumeResult,
    RoleChange,
    RoleChanged,
    SessionMoved,
    StartResult,
    StopResult,
    SwitchResult,
    WorkerStart,
    WorkerStop,
)
from fleetctl.engine.fleet.ops.stages import STAGES, progress
from fleetctl.engine.server.open_model import OpenModel
from fleetctl.store.records import DeviceRecord

__all__ = [
    "STAGES", "CheckpointResult", "DrainResult", "LiveMigrateResult", "MoveResult", "MoveStageDone",
    "OperationResult", "RebalancePreview", "RebalanceResult", "RestartResult", "RestoreResult", "ResumeResult",
    "RoleChange", "RoleChanged", "SessionMoved", "StartResult", "StopResult", "SwitchResult", "WorkerStart",
    "WorkerStop", "describe", "operation_info",
]


class WorkerInfo(OpenModel):
    id: str
    role: str
    device: str
    node: str | None  # a Ray fleet's node (None: this machine)
    node_lost: bool
    state: str
    pid: int | None
    sessions: int
    kv_usage: float
    kv_blocks: int
    weights: str = ""  # the layers' weight format: the dtype (bfloat16) or int8, int4-g64, int4-gguf; "" starting
    free_blocks: int
    busy: float
    mfu: float
    mbu: float
    tokens_per_s: float
    prefix_hit_ratio: float
    was: str | None = None  # its id before it switched role in place (`fleetctl switch`)


class PoolInfo(OpenModel):
    workers: int
    busy: float
    mfu: float
    mbu: float
    queue: int
    prefix_hit_ratio: float
    # prompt tokens each KV tier read back for its workers (part of the cached)
    tier_tokens: dict[str, int] = Field(default_factory=dict)


class TierInfo(OpenModel):
    """One KV tier under the pools (node-wide): what it holds against its bound, as last measured."""

    used_bytes: int
    capacity_bytes: int


class StoreInfo(OpenModel):
    """The metrics store the fleet writes: failing while its file refuses writes (a full disk, an I/O error), the
    rows kept meanwhile; requests never wait on it."""

    path: str
    failing: bool
    problem: str | None = None  # "disk full", "I/O error", "read-only", …
    error: str | None = None  # the whole line: the file, what is wrong, what to do
    failing_since: float | None = None  # time.time() of the first refused write
    kept_rows: int = 0


class SplitRegretInfo(OpenModel):
    """The current layout's goodput as a share of the best layout's, replayed over the last 5 minutes every
    interval (fleet/ops/split_regret.py): the newest replay, and the series of its ratios, oldest first."""

    ratio: float
    current: str
    best: str
    at: float
    series: list[float]


class FleetStatus(OpenModel):
    model: str
    url: str
    pid: int
    window_s: float
    workers: list[WorkerInfo]
    pools: dict[str, PoolInfo]  # by role
    local_prefills: int
    store: StoreInfo | None = None  # None: the fleet keeps no store
    # by tier (host, disk), once a worker reported one; {}: the fleet has none
    kv_tiers: dict[str, TierInfo] = Field(default_factory=dict)
    split_regret: SplitRegretInfo | None = None  # None: no store, or no window replayed yet


class WorkerList(OpenModel):
    workers: list[WorkerInfo]


class LogLineInfo(OpenModel):
    seq: int  # increasing across sources: ask `since` the last one seen for only newer lines
    time: float  # time.time() when the controller read it
    source: str  # "fleet" (the controller) or a worker id
    level: str  # info, warning, error
    text: str


class FleetLogLines(OpenModel):
    lines: list[LogLineInfo]  # oldest first
    next: int  # the `since` that asks for lines after these


class SessionInfo(OpenModel):
    id: str
    stage: str
    prompt_tokens: int
    output_tokens: int
    age_s: float


class WorkerSessions(OpenModel):
    worker: str
    sessions: list[SessionInfo]


class CheckpointEntry(OpenModel):
    checkpoint: str
    name: str
    used_at: str | None
    valid: bool
    error: str | None = None  # an invalid one: why
    worker: str | None = None
    role: str | None = None
    sessions: int | None = None
    created: str | None = None
    bytes: int | None = None


class CheckpointList(OpenModel):
    checkpoints: list[CheckpointEntry]


class OperationInfo(BaseModel):
    """`/fleet/operations/{id}`, and the 202 body of every operation started."""

    model_config = ConfigDict(frozen=True)

    id: str
    kind: OpKind
    worker: str
    device: str | None
    state: OpState
    step: str  # one of its kind's stages (STAGES)
    stage: str  # the step with its detail, for people
    progress: float | None  # how far through its kind's stages (1.0 once it ended)
    started: float
    result: OperationResult | None
    error: str | None
    writer_pid: int | None
    destination_pid: int | None

    @model_validator(mode="before")
    @classmethod
    def _result_of_its_kind(cls, data: Any) -> Any:
        """Parsed JSON: the result's model is the operation's kind's (and for a migration, its mode's)."""
        if isinstance(data, dict) and isinstance(data.get("result"), dict):
            return data | {"result": data["result"] | {"kind": data.get("kind")}}
        return data


def operation_info(op: Operation) -> OperationInfo:
    return OperationInfo(id=op.id, kind=op.kind, worker=op.worker_id, device=op.device, state=op.state,
                         step=op.step, stage=op.stage,
                         progress=1.0 if op.state is not OpState.RUNNING else progress(op.kind, op.step),
                         started=op.started, result=op.result, error=op.error, writer_pid=op.writer_pid,
                         destination_pid=op.destination_pid)


def describe(op: OperationInfo) -> str:
    """One sentence for people: what a done operation did, why one failed or was called off, or where one
    still running is."""
    if op.state is OpState.FAILED:
        failed = f"{op.kind.value} of {op.worker} failed"
        error = op.error or "no reason given"  # a checkpoint's own step failing says it already (not twice)
        return error if error.startswith(failed) else f"{failed}: {error}"
    if op.state is OpState.CANCELLED:
        return f"{op.kind.value} of {op.worker} called off: {op.error}"
    if op.state is OpState.RUNNING or op.result is None:
        return f"{op.kind.value} of {op.worker}: {op.stage}"
    return op.result.describe()


class RequestRecord(OpenModel):
    """A finished request's timing breakdown (`TrackedRequest.record`)."""

    request_id: str
    arrival: float
    queue_s: float
    prefill_s: float
    ttft_s: float
    handoff_s: float
    handoff_bytes: int
    handoff_wall_s: float
    first_decode_s: float
    decode_s: float
    e2e_s: float
    prompt_tokens: int
    output_tokens: int
    prefill_worker: str | None
    decode_worker: str | None
    outcome: str
    recomputes: int
    prefill_cached_tokens: int
    prefill_computed_tokens: int
    local_prefill: bool
    tier_cached_tokens: dict[str, int] = Field(default_factory=dict)  # of the cached ones, what a KV tier served
    session: str = ""  # the agent session it was a turn of (X-Session-Id or `user`)
    stage: str = "done"  # a live one's: queued, prefill, handoff, decode (its times so far, up to now)


class RecentRequests(OpenModel):
    requests: list[RequestRecord]  # finished, newest last
    live: list[RequestRecord] = Field(default_factory=list)  # not finished yet, oldest first


class SplitInfo(OpenModel):
    prefill: int
    decode: int
    mixed: int
    layout: str
    devices: int = 0  # workers in all (0 from a fleet that predates it)


class PlanCandidate(SplitInfo):
    goodput: float | str  # requests meeting both SLOs per second
    ttft_p90_s: float
    tpot_p90_s: float | None
    good_requests: int
    requests: int
    e2e_mean_s: float


class PlanSlo(OpenModel):
    ttft_s: float
    tpot_s: float


class FleetPlan(OpenModel):
    """`plan --json`: `recommended`, `current`, `candidates`, `reason`, and more."""

    recommended: SplitInfo
    current: SplitInfo | None
    candidates: list[PlanCandidate]  # best first
    reason: str
    best_split: SplitInfo | None
    gain_pct: float | str | None
    window_s: float
    source: str
    requests: int
    slo: PlanSlo
    devices: list[str]
    what_if: dict[str, Any] | None
    fit: dict[str, Any]
    notes: list[str]
    elastic: bool = False  # the candidates use any number of `devices`


class ClassificationBucket(OpenModel):
    prompt_tokens: str  # a length bucket's label, e.g. "128-512"
    output_tokens: str
    requests: int
    prefill_share: float


class FleetClassification(OpenModel):
    """`classify --json` (`store.classify.Classification`): the window's model time by phase."""

    window_s: float
    requests: int
    prefill_share: float
    decode_share: float
    prefill_model_s: float
    decode_model_s: float
    buckets: list[ClassificationBucket]  # non-empty buckets only
    prefill_cached_tokens: int
    prefill_computed_tokens: int
    prefix_hit_ratio: float
    local_prefills: int
    # of the cached tokens, what each KV tier served (none: absent)
    tier_tokens: dict[str, int] = Field(default_factory=dict)


class DevicePeak(OpenModel):
    identity: str
    dtype: str
    kind: str
    name: str
    peak_flops: float
    peak_bytes_per_s: float
    how: str  # calibrated or spec-table
    measured_at: float  # unix seconds

    @classmethod
    def of(cls, record: DeviceRecord) -> "DevicePeak":
        return cls(identity=record.identity, dtype=record.dtype, kind=record.kind.value, name=record.name,
                   peak_flops=record.peak_flops, peak_bytes_per_s=record.peak_bytes_per_s,
                   how=record.how_measured.value, measured_at=record.measured_at)


class DeviceWorker(OpenModel):
    """A live worker on a device, in the weight format it serves (`devices` asked of a fleet)."""

    id: str
    role: str
    device: str
    device_name: str  # the device as the worker named it when ready ("" while it starts)
    weights: str  # bfloat16, int8, int4-g64, int4-gguf; "" while it starts


class DevicePeaks(OpenModel):
    """`devices --json`: the store's peaks per device identity and dtype (the MFU and MBU denominators), and, from
    a fleet, its workers on those devices with their weight formats."""

    devices: list[DevicePeak]
    not_recalibrated: list[str]  # identities `devices --recalibrate` left as they were (always empty from a fleet)
    workers: list[DeviceWorker] = Field(default_factory=list)  # empty from a store file
