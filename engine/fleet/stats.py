"""The controller's live numbers: per-worker busy time over a sliding window, handoffs, failures,
finished-request records, and the Prometheus collectors behind GET /metrics (the names are listed in
docs/architecture.md, "Metrics")."""

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from fleetctl.domain import Phase, WorkerRole
from fleetctl.engine.fleet.kv_flow import Arrival, KVFlow
from fleetctl.engine.fleet.request import TrackedRequest
from fleetctl.engine.fleet.tier_metrics import TierMetrics
from fleetctl.engine.fleet.worker_view import WorkerView
from fleetctl.engine.worker.protocol import StepReport

BUSY_WINDOW_S = 5.0
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


@dataclass
class PrefillTokens:
    """One worker's prefill steps since it started: prompt tokens a prefix cache served, tokens computed."""

    role: WorkerRole
    cached: int = 0
    computed: int = 0
    tiers: dict[str, int] = field(default_factory=dict)  # of the cached: tokens each KV tier read back


@dataclass
class Drafts:
    """One worker's speculative decoding since it started: draft tokens verified, of them kept, and the sequences'
    verifications (a sequence's draft in one step)."""

    drafted: int = 0
    accepted: int = 0
    verifications: int = 0

    def add(self, other: "Drafts") -> "Drafts":
        return Drafts(self.drafted + other.drafted, self.accepted + other.accepted,
                      self.verifications + other.verifications)

    @property
    def acceptance(self) -> float | None:
        """The share of draft tokens that stood (None: nothing drafted)."""
        return round(self.accepted / self.drafted, 4) if self.drafted else None

    @property
    def tokens_per_step(self) -> float | None:
        """Tokens a verifying sequence gained per step: the drafted ones that stood and its own (None: none)."""
        return round(1 + self.accepted / self.verifications, 3) if self.verifications else None


@dataclass(frozen=True)
class LiveUtilization:
    busy: float  # share of wall time in model steps
    mfu: float  # achieved model FLOP/s over the device's peak
    mbu: float  # achieved bytes/s over the device's peak bandwidth
    tokens_per_s: float  # tokens its steps processed (prompt tokens prefilled, tokens decoded) per wall second


class FleetStats:
    def __init__(self, max_records: int = 10_000) -> None:
        # worker -> (end, seconds, flops, bytes, tokens) of its recent steps
        self._steps: dict[str, deque[tuple[float, float, int, int, int]]] = {}
        self._peaks: dict[str, tuple[float, float]] = {}
        self.prefill_tokens: dict[str, PrefillTokens] = {}  # worker -> its prefills' tokens since it started
        self.drafts: dict[str, Drafts] = {}  # worker -> its speculative decoding since it started
        # worker -> kind -> finished requests it computed whose output a grammar held, since it started
        self.structured_by_worker: dict[str, dict[str, int]] = {}
        self.local_prefill_count = 0  # requests prefilled by their decode worker (conditional disaggregation)
        self.flow = KVFlow()  # how prompts reached their decoding worker, over the last minute
        self.records: deque[dict] = deque(maxlen=max_records)
        self._generated = 0  # tokens of finished requests, for the log's rate
        self._last_summary = (time.time(), 0)
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
        self.handoffs_by_route = Counter("fleet_kv_handoffs", "KV handoffs by route: local (shared memory, CUDA IPC) "
                                         "or cross-node (a Ray cluster's object store)", ["route"], registry=r)
        self.running = Gauge("fleet_requests_running", "Sequences running on a worker", ["worker"], registry=r)
        self.waiting = Gauge("fleet_requests_waiting", "Sequences waiting on a worker", ["worker"], registry=r)
        self.kv_usage = Gauge("fleet_kv_cache_usage_ratio", "KV blocks in use", ["worker"], registry=r)
        self.busy = Gauge("fleet_worker_busy_ratio", "Share of wall time in model steps", ["worker", "role"],
                          registry=r)
        self.mfu = Gauge("fleet_worker_mfu", "Model FLOP/s over device peak", ["worker", "role"], registry=r)
        self.mbu = Gauge("fleet_worker_mbu", "Bytes/s over device peak bandwidth", ["worker", "role"], registry=r)
        self.stalled = Gauge("fleet_worker_stalled_seconds", "How long a worker holding work has gone without a step, "
                             "once past its stall bound (0: it steps)", ["worker", "role"], registry=r)
        self.migrations = Counter("fleet_migrations", "Worker migrations", ["mode"], registry=r)
        self.migration_downtime = Histogram(
            "fleet_migration_downtime_seconds", "A live-moved session's stall: its last token from the source to "
            "its first from the destination", registry=r, buckets=LATENCY_BUCKETS)
        self.failures = Counter("fleet_worker_failures", "Workers that died", ["role"], registry=r)
        self.cached_tokens = Counter("fleet_prefill_cached_tokens", "Prompt tokens a prefix cache served",
                                     ["worker", "role"], registry=r)
        self.computed_tokens = Counter("fleet_prefill_computed_tokens", "Tokens prefill steps computed",
                                       ["worker", "role"], registry=r)
        self.hit_ratio = Gauge("fleet_prefix_cache_hit_ratio", "Share of prefill tokens served by the prefix "
                               "cache, per worker", ["worker", "role"], registry=r)
        self.pool_hit_ratio = Gauge("fleet_pool_prefix_cache_hit_ratio", "Share of prefill tokens served by the "
                                    "prefix cache, per pool", ["role"], registry=r)
        self.tier_hits = Counter("fleet_kv_tier_hits", "Prompt tokens a KV tier under the pools served (read back "
                                 "instead of computed)", ["tier", "worker", "role"], registry=r)
        self.tier_io = TierMetrics(r)
        self.local_prefills = Counter("fleet_local_prefills", "Requests their decode worker prefilled (no handoff)",
                                      registry=r)
        self.structured = Counter("fleet_structured_output_requests", "Finished requests whose output a grammar "
                                  "held (response_format, tool calls), by kind", ["kind"], registry=r)
        self.mask_seconds = Counter("fleet_grammar_mask_seconds", "Seconds computing grammar masks, beside the "
                                    "forward passes", ["worker", "role"], registry=r)
        # vLLM's names, so dashboards built for vLLM read a fleet too
        self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Draft tokens decode steps verified "
                                    "(speculative decoding)", ["worker", "role"], registry=r)
        self.accepted_tokens = Counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens that stood",
                                       ["worker", "role"], registry=r)
        self.verifications = Counter("vllm:spec_decode_num_drafts", "Drafts verified (a sequence's draft in one "
                                     "step)", ["worker", "role"], registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated by finished requests",
                                         registry=r)
        self.request_success = Counter("vllm:request_success", "Requests that finished", ["finished_reason"],
                                       registry=r)

    def on_step(self, view: WorkerView, report: StepReport) -> None:
        window = self._steps.setdefault(view.worker_id, deque())
        window.append((report.ended_at, report.seconds, report.flops, report.bytes, report.num_tokens))
        _forget_before(window, report.ended_at - BUSY_WINDOW_S)
        self._peaks[view.worker_id] = (view.peak_flops, view.peak_bytes_per_s)
        self.tier_io.on_report(view, report.tier_io)
        if report.drafted:
            self.draft_tokens.labels(worker=view.worker_id, role=view.role.value).inc(report.drafted)
            self.accepted_tokens.labels(worker=view.worker_id, role=view.role.value).inc(report.accepted)
            self.verifications.labels(worker=view.worker_id, role=view.role.value).inc(report.verifications)
            step = Drafts(report.drafted, report.accepted, report.verifications)
            self.drafts[view.worker_id] = self.drafts.get(view.worker_id, Drafts()).add(step)
        if report.mask_seconds:
            self.mask_seconds.labels(worker=view.worker_id, role=view.role.value).inc(sum(report.mask_seconds.values()))
        if report.phase is Phase.PREFILL:
            cached = sum(report.cached_tokens.values())
            computed = sum(report.seq_tokens) + sum(report.chunks.values())
            totals = self.prefill_tokens.setdefault(view.worker_id, PrefillTokens(view.role))
            totals.cached += cached
            totals.computed += computed
            self.cached_tokens.labels(worker=view.worker_id, role=view.role.value).inc(cached)
            self.computed_tokens.labels(worker=view.worker_id, role=view.role.value).inc(computed)
            for by_tier in report.tier_tokens.values():
                for tier, tokens in by_tier.items():
                    self.tier_hits.labels(tier=tier, worker=view.worker_id, role=view.role.value).inc(tokens)
                    totals.tiers[tier] = totals.tiers.get(tier, 0) + tokens

    def on_local_prefill(self) -> None:
        self.local_prefill_count += 1
        self.local_prefills.inc()
        self.flow.arrived(Arrival.LOCAL_PREFILL)

    def hit_ratio_of(self, worker_ids: list[str]) -> float:
        """Share of the prefill tokens of these workers (since they started) that a prefix cache served."""
        cached = sum(self.prefill_tokens[w].cached for w in worker_ids if w in self.prefill_tokens)
        computed = sum(self.prefill_tokens[w].computed for w in worker_ids if w in self.prefill_tokens)
        return cached / (cached + computed) if cached + computed else 0.0

    def drafts_of(self, worker_ids: list[str]) -> Drafts:
        """These workers' speculative decoding since they started, together."""
        total = Drafts()
        for worker_id in worker_ids:
            total = total.add(self.drafts.get(worker_id, Drafts()))
        return total

    def tier_tokens_of(self, worker_ids: list[str]) -> dict[str, int]:
        """Prompt tokens each KV tier read back for these workers since they started (a part of the cached)."""
        return _summed(self.prefill_tokens[w].tiers for w in worker_ids if w in self.prefill_tokens)

    def structured_of(self, worker_ids: list[str]) -> dict[str, int]:
        """Finished requests these workers computed whose output a grammar held, by kind, since they started (a
        request they shared counts once per worker)."""
        return _summed(self.structured_by_worker[w] for w in worker_ids if w in self.structured_by_worker)

    def utilization(self, worker_id: str, now: float | None = None) -> LiveUtilization:
        """Over the last BUSY_WINDOW_S seconds of wall time: busy share, achieved FLOP/s and bytes/s over the
        device's peaks, and tokens per second. A step that began before the window counts only for its part
        inside it, so none of the three shares can pass 1 unless a step report or a peak is wrong."""
        now = now or time.time()
        start = now - BUSY_WINDOW_S
        window = self._steps.get(worker_id, deque())
        _forget_before(window, start)
        busy = flops = nbytes = tokens = 0.0
        for ended, seconds, step_flops, step_bytes, step_tokens in window:
            inside = max(0.0, min(ended, now) - max(ended - seconds, start))
            share = inside / seconds if seconds > 0 else 1.0
            busy, flops, nbytes = busy + inside, flops + step_flops * share, nbytes + step_bytes * share
            tokens += step_tokens * share
        peak_flops, peak_bytes = self._peaks.get(worker_id, (0.0, 0.0))
        return LiveUtilization(
            busy=busy / BUSY_WINDOW_S,
            mfu=flops / BUSY_WINDOW_S / peak_flops if peak_flops else 0.0,
            mbu=nbytes / BUSY_WINDOW_S / peak_bytes if peak_bytes else 0.0,
            tokens_per_s=tokens / BUSY_WINDOW_S,
        )

    def on_handoff(self, nbytes: int, seconds: float, cross_node: bool = False) -> None:
        self.handoff_hist.observe(seconds)
        self.handoff_bytes_total.inc(nbytes)
        self.handoffs_by_route.labels(route="cross-node" if cross_node else "local").inc()

    def on_failure(self, role: WorkerRole) -> None:
        self.failures.labels(role=role.value).inc()

    def on_request_done(self, req: TrackedRequest) -> None:
        record = req.record()
        self.records.append(record)
        self.prompt_tokens.inc(record["prompt_tokens"])
        self.generation_tokens.inc(record["output_tokens"])
        self._generated += record["output_tokens"]
        if req.params.grammar is not None:
            kind = req.params.constraint.partition(":")[0] or "grammar"
            self.structured.labels(kind=kind).inc()
            for worker_id in {w for w in (req.prefill_worker, req.decode_worker) if w}:
                kinds = self.structured_by_worker.setdefault(worker_id, {})
                kinds[kind] = kinds.get(kind, 0) + 1
        if req.error or not req.output_token_ids:
            return
        self.request_success.labels(finished_reason=req.finish_reason or "stop").inc()
        self.ttft.observe(record["ttft_s"])
        self.e2e.observe(record["e2e_s"])
        if record["output_tokens"] > 1:
            self.itl.observe(record["decode_s"] / (record["output_tokens"] - 1))

    def summary(self, views: list[WorkerView]) -> str:
        """One line for the server's log: the generation rate since the last line, what runs and waits,
        KV use, and each worker's busy share."""
        now = time.time()
        since, tokens_then = self._last_summary
        self._last_summary = (now, self._generated)
        rate = (self._generated - tokens_then) / max(now - since, 1e-9)
        running, waiting = sum(v.running for v in views), sum(v.waiting for v in views)
        kv = max((v.kv.usage for v in views), default=0.0)
        busy = " ".join(f"{v.worker_id} {self.utilization(v.worker_id).busy:.0%}" for v in views)
        return f"generation {rate:.1f} tokens/s · running {running} · waiting {waiting} · KV max {kv:.0%} · busy {busy}"

    def exposition(self, views: list[WorkerView]) -> bytes:
        """GET /metrics: every collector in Prometheus' text format, the per-worker gauges refreshed first."""
        self.refresh_gauges(views)
        return generate_latest(self.registry)

    def refresh_gauges(self, views: list[WorkerView]) -> None:
        for v in views:
            self.running.labels(worker=v.worker_id).set(v.running)
            self.waiting.labels(worker=v.worker_id).set(v.waiting)
            self.kv_usage.labels(worker=v.worker_id).set(v.kv.usage)
            util = self.utilization(v.worker_id)
            self.busy.labels(worker=v.worker_id, role=v.role.value).set(util.busy)
            self.mfu.labels(worker=v.worker_id, role=v.role.value).set(util.mfu)
            self.mbu.labels(worker=v.worker_id, role=v.role.value).set(util.mbu)
            self.stalled.labels(worker=v.worker_id, role=v.role.value).set(v.stalled_s() or 0.0)
            self.hit_ratio.labels(worker=v.worker_id, role=v.role.value).set(self.hit_ratio_of([v.worker_id]))
        for role in {v.role for v in views}:
            members = [w for w, totals in self.prefill_tokens.items() if totals.role is role]
            self.pool_hit_ratio.labels(role=role.value).set(self.hit_ratio_of(members))


def _summed(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    """Counts by name, added up."""
    total: dict[str, int] = {}
    for by_name in counts:
        for name, count in by_name.items():
            total[name] = total.get(name, 0) + count
    return total


def _forget_before(window: deque[tuple[float, float, int, int]], start: float) -> None:
    """Drop steps that ended before `start`: bounded memory whether or not anyone reads the window."""
    while window and window[0][0] < start:
        window.popleft()
