"""What the console shows, fetched in one go: the fleet's live state (`/fleet/status`) and its history
(the store's `history()` shape, from a local store or `/fleet/history`), plus whether the fleet
answered at all. Plain data: the widgets render it, tests build it by hand."""

from dataclasses import dataclass, field

HISTORY_WINDOW_S = 300.0  # five minutes of charts
HISTORY_BUCKET_S = 5.0


@dataclass(frozen=True)
class FleetSnapshot:
    reachable: bool
    error: str = ""  # why the fleet did not answer (shown in the banner)
    status: dict = field(default_factory=dict)  # /fleet/status: model, url, workers, pools
    history: dict = field(default_factory=dict)  # store/history.py's shape; {} when no history is available
    host: dict = field(default_factory=dict)  # this machine's view: {"gpus": [...], "processes": {pid: cpu %}}

    @property
    def workers(self) -> list[dict]:
        return self.status.get("workers", [])

    @property
    def pools(self) -> dict[str, dict]:
        return self.status.get("pools", {})

    def worker(self, worker_id: str) -> dict | None:
        return next((w for w in self.workers if w["id"] == worker_id), None)

    def pool_series(self, role: str, metric: str) -> list[float]:
        return _settled(self.history.get("pools", {}).get(role, []), metric)

    def worker_series(self, worker_id: str, metric: str) -> list[float]:
        return _settled(self.history.get("workers", {}).get(worker_id, []), metric)

    def tokens_per_s(self, worker_id: str) -> float:
        """The fleet's live rate (`/fleet/status`, its last few seconds), as busy, MFU and MBU are: the store's
        newest bucket is still filling (samples reach it seconds late), so its rate reads 0 most of the time."""
        return (self.worker(worker_id) or {}).get("tokens_per_s", 0.0)


def _settled(points: list[dict], metric: str) -> list[float]:
    """A chart's values without the newest bucket: it holds now and is still filling (samples reach the store
    2-4 s late), so it would draw as a drop to zero at the right edge every few seconds."""
    return [point[metric] for point in points[:-1]]
