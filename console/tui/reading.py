"""What the console shows, fetched in one go: the fleet's live state (`/fleet/status`, a `FleetStatus`) and its
history (a `FleetHistory`, from a local store or `/fleet/history`), plus whether the fleet answered at all.
Plain data: the widgets render it, tests build it from the contract's models."""

from dataclasses import dataclass, field

from fleetctl.engine.api.history import FleetHistory, HistoryPoint
from fleetctl.engine.api.status import FleetStatus, PoolInfo, TierInfo, WorkerInfo

HISTORY_WINDOW_S = 300.0  # five minutes of charts
HISTORY_BUCKET_S = 5.0
NO_HISTORY = "no history: the fleet has no metrics store"
HISTORY_PENDING = "history: reading the store…"


@dataclass(frozen=True)
class FleetReading:
    reachable: bool
    error: str = ""  # why the fleet did not answer (shown in the banner)
    status: FleetStatus | None = None  # None when the fleet did not answer
    history: FleetHistory | None = None  # None when no history is available (yet: `history_note` says which)
    history_note: str = NO_HISTORY  # what the charts say while `history` is None
    host: dict = field(default_factory=dict)  # this machine's view: {"gpus": [...], "processes": {pid: cpu %}}

    @property
    def workers(self) -> list[WorkerInfo]:
        return self.status.workers if self.status else []

    @property
    def pools(self) -> dict[str, PoolInfo]:
        return self.status.pools if self.status else {}

    @property
    def kv_tiers(self) -> dict[str, TierInfo]:
        return self.status.kv_tiers if self.status else {}

    def worker(self, worker_id: str) -> WorkerInfo | None:
        return next((w for w in self.workers if w.id == worker_id), None)

    def pool_series(self, role: str, metric: str) -> list[float]:
        return _settled(self.history.pools.get(role, []) if self.history else [], metric)

    def latency_series(self, metric: str) -> list[float | None]:
        """A LatencyPoint field over the window's settled buckets (None where no request arrived)."""
        points = self.history.latency[:-1] if self.history else []
        return [getattr(point, metric) for point in points]

    def worker_series(self, worker_id: str, metric: str) -> list[float]:
        return _settled(self.history.workers.get(worker_id, []) if self.history else [], metric)

    def tokens_per_s(self, worker_id: str) -> float:
        """The fleet's live rate (`/fleet/status`, its last few seconds), as busy, MFU and MBU are: the store's
        newest bucket is still filling (samples reach it seconds late), so its rate reads 0 most of the time."""
        worker = self.worker(worker_id)
        return worker.tokens_per_s if worker else 0.0


def _settled(points: list[HistoryPoint], metric: str) -> list[float]:
    """A chart's values without the newest bucket: it holds now and is still filling (samples reach the store
    2-4 s late), so it would draw as a drop to zero at the right edge every few seconds."""
    return [getattr(point, metric) for point in points[:-1]]
