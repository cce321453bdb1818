"""`/metrics` for the KV tiers under the pools: bytes read and written and the seconds they took, per tier and
worker (their ratio over a window is the tier's bandwidth: `rate(..._read_bytes) / rate(..._read_seconds)`),
and each tier's occupancy against its bound. Workers report their process's running totals with each step
(`StepReport.tier_io`); what grew since a process's last report is added here, so a switch (a new id, the
same process) counts nothing twice and a restarted process starts from zero."""

from prometheus_client import CollectorRegistry, Counter, Gauge

from fleetctl.engine.core.kv_tiers.file_tier import TierStats
from fleetctl.engine.fleet.worker_view import WorkerView


class TierMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["tier", "worker"]
        self.read_bytes = Counter("fleet_kv_tier_read_bytes", "Bytes read back from a KV tier (records hit)",
                                  labels, registry=registry)
        self.written_bytes = Counter("fleet_kv_tier_written_bytes", "Bytes written to a KV tier", labels,
                                     registry=registry)
        self.read_seconds = Counter("fleet_kv_tier_read_seconds", "Seconds spent reading and checking records hit",
                                    labels, registry=registry)
        self.write_seconds = Counter("fleet_kv_tier_write_seconds", "Seconds the background writer spent writing",
                                     labels, registry=registry)
        self.used = Gauge("fleet_kv_tier_used_bytes", "Bytes a KV tier holds (node-wide, as last measured)",
                          ["tier"], registry=registry)
        self.capacity = Gauge("fleet_kv_tier_capacity_bytes", "A KV tier's bound", ["tier"], registry=registry)
        self._seen: dict[tuple[int | None, str], TierStats] = {}  # (pid, tier) -> its last report
        self._used_at: dict[str, float] = {}  # tier -> when the occupancy shown was measured
        self.occupancy: dict[str, tuple[int, int]] = {}  # tier -> (bytes it holds, its bound), as the gauges say

    def on_report(self, view: WorkerView, io: dict[str, TierStats]) -> None:
        for tier, now in io.items():
            before = self._seen.get((view.pid, tier), TierStats())
            self._seen[(view.pid, tier)] = now
            for counter, grown in ((self.read_bytes, now.bytes_read - before.bytes_read),
                                   (self.written_bytes, now.bytes_written - before.bytes_written),
                                   (self.read_seconds, now.read_s - before.read_s),
                                   (self.write_seconds, now.write_s - before.write_s)):
                if grown > 0:
                    counter.labels(tier=tier, worker=view.worker_id).inc(grown)
            used = self.occupancy.get(tier, (0, 0))[0]
            if now.used_at >= self._used_at.get(tier, 0.0):  # a process that only reads measured long ago
                self._used_at[tier], used = now.used_at, now.used_bytes
                self.used.labels(tier=tier).set(used)
            self.capacity.labels(tier=tier).set(now.capacity_bytes)
            self.occupancy[tier] = (used, now.capacity_bytes)
