"""The controller's live numbers: per-worker busy time over a sliding window, handoffs, failures,
finished-request records, and the Prometheus collectors behind GET /metrics (the names are listed in
docs/architecture.md, "Metrics")."""

import time
from collections import deque
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fleetctl.engine.fleet.request import TrackedRequest
from fleetctl.engine.fleet.router import WorkerView
from fleetctl.engine.worker.protocol import StepReport
from fleetctl.store.records import WorkerRole

BUSY_WINDOW_S = 5.0
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


@dataclass(frozen=True)
class LiveUtilization:
    busy: float  # share of wall time in model steps
    mfu: float  # achieved model FLOP/s over the device's peak
    mbu: float  # achieved bytes/s over the device's peak bandwidth


class FleetStats:
    def __init__(self, max_records: int = 10_000) -> None:
        self._steps: dict[str, deque[tuple[float, float, int, int]]] = {}  # worker -> (end, seconds, flops, bytes)
        self._peaks: dict[str, tuple[float, float]] = {}
        self.records: deque[dict] = deque(maxlen=max_records)
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram("fleet_time_to_first_token_seconds", "Time to first token", registry=r,
                              buckets=LATENCY_BUCKETS)
        self.itl = Histogram("fleet_inter_token_latency_seconds", "Mean time per output token after the first",
                             registry=r, buckets=LATENCY_BUCKETS)
        self.e2e = Histogram("fleet_e2e_request_latency_seconds", "End-to-end request latency", registry=r,
                             buckets=LATENCY_BUCKETS)
        self.handoff_hist = Histogram("fleet_kv_handoff_seconds", "KV handoff time (publish + copy)",
                                      registry=r, buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 1))
        self.handoff_bytes_total = Counter("fleet_kv_handoff_bytes", "KV bytes handed off", registry=r)
        self.running = Gauge("fleet_requests_running", "Sequences running on a worker", ["worker"], registry=r)
        self.waiting = Gauge("fleet_requests_waiting", "Sequences waiting on a worker", ["worker"], registry=r)
        self.kv_usage = Gauge("fleet_kv_cache_usage_ratio", "KV blocks in use", ["worker"], registry=r)
        self.busy = Gauge("fleet_worker_busy_ratio", "Share of wall time in model steps", ["worker", "role"],
                          registry=r)
        self.mfu = Gauge("fleet_worker_mfu", "Model FLOP/s over device peak", ["worker", "role"], registry=r)
        self.mbu = Gauge("fleet_worker_mbu", "Bytes/s over device peak bandwidth", ["worker", "role"], registry=r)
        self.migrations = Counter("fleet_migrations", "Worker migrations", ["mode"], registry=r)
        self.failures = Counter("fleet_worker_failures", "Workers that died", ["role"], registry=r)

    def on_step(self, view: WorkerView, report: StepReport) -> None:
        window = self._steps.setdefault(view.worker_id, deque())
        window.append((report.ended_at, report.seconds, report.flops, report.bytes))
        _forget_before(window, report.ended_at - BUSY_WINDOW_S)
        self._peaks[view.worker_id] = (view.peak_flops, view.peak_bytes_per_s)

    def utilization(self, worker_id: str, now: float | None = None) -> LiveUtilization:
        """Over the last BUSY_WINDOW_S seconds of wall time: busy share, and achieved FLOP/s and bytes/s
        over the device's peaks. A step that began before the window counts only for its part inside
        it, so none of the three can pass 1 unless a step report or a peak is wrong."""
        now = now or time.time()
        start = now - BUSY_WINDOW_S
        window = self._steps.get(worker_id, deque())
        _forget_before(window, start)
        busy = flops = nbytes = 0.0
        for ended, seconds, step_flops, step_bytes in window:
            inside = max(0.0, min(ended, now) - max(ended - seconds, start))
            share = inside / seconds if seconds > 0 else 1.0
            busy, flops, nbytes = busy + inside, flops + step_flops * share, nbytes + step_bytes * share
        peak_flops, peak_bytes = self._peaks.get(worker_id, (0.0, 0.0))
        return LiveUtilization(
            busy=busy / BUSY_WINDOW_S,
            mfu=flops / BUSY_WINDOW_S / peak_flops if peak_flops else 0.0,
            mbu=nbytes / BUSY_WINDOW_S / peak_bytes if peak_bytes else 0.0,
        )

    def on_handoff(self, nbytes: int, seconds: float) -> None:
        self.handoff_hist.observe(seconds)
        self.handoff_bytes_total.inc(nbytes)

    def on_failure(self, role: WorkerRole) -> None:
        self.failures.labels(role=role.value).inc()

    def on_request_done(self, req: TrackedRequest) -> None:
        record = req.record()
        self.records.append(record)
        if req.error or not req.output_token_ids:
            return
        self.ttft.observe(record["ttft_s"])
        self.e2e.observe(record["e2e_s"])
        if record["output_tokens"] > 1:
            self.itl.observe(record["decode_s"] / (record["output_tokens"] - 1))

    def refresh_gauges(self, views: list[WorkerView]) -> None:
        for v in views:
            self.running.labels(worker=v.worker_id).set(v.running)
            self.waiting.labels(worker=v.worker_id).set(v.waiting)
            self.kv_usage.labels(worker=v.worker_id).set(v.kv_usage)
            util = self.utilization(v.worker_id)
            self.busy.labels(worker=v.worker_id, role=v.role.value).set(util.busy)
            self.mfu.labels(worker=v.worker_id, role=v.role.value).set(util.mfu)
            self.mbu.labels(worker=v.worker_id, role=v.role.value).set(util.mbu)


def _forget_before(window: deque[tuple[float, float, int, int]], start: float) -> None:
    """Drop steps that ended before `start`: bounded memory whether or not anyone reads the window."""
    while window and window[0][0] < start:
        window.popleft()
