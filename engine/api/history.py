"""`GET /fleet/history`'s response: per-pool and per-worker utilization points, the traffic over the window,
TTFT/TPOT percentiles per bucket and the newest events — what the console's charts, trends and events draw.
Torch-free."""

from typing import Any

from pydantic import Field

from fleetctl.engine.api.open_model import OpenModel


class HistoryPoint(OpenModel):
    ts: float
    busy: float
    mfu: float
    mbu: float
    tokens_per_s: float


class LatencyPoint(OpenModel):
    """One bucket's successful requests (by arrival): their TTFT and TPOT percentiles, None where none arrived."""

    ts: float
    ttft_p50: float | None
    ttft_p99: float | None
    tpot_p50: float | None
    tpot_p99: float | None


class Percentiles(OpenModel):
    p50: float | None
    p99: float | None


class Traffic(OpenModel):
    requests: int
    requests_per_s: float
    ttft_s: Percentiles
    tpot_s: Percentiles
    prefill_share: float
    decode_share: float
    handoff_bytes_per_s: float
    handoff_share_of_e2e: float


class EventRecord(OpenModel):
    ts: float
    kind: str
    worker: str | None
    details: dict[str, Any]


class FleetHistory(OpenModel):
    now: float
    window_s: float
    bucket_s: float
    pools: dict[str, list[HistoryPoint]]  # by role
    workers: dict[str, list[HistoryPoint]]  # by worker id
    traffic: Traffic
    latency: list[LatencyPoint] = Field(default_factory=list)  # per bucket (empty from a fleet that predates it)
    events: list[EventRecord]  # newest last
