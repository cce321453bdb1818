"""Read side of the store: per-worker and per-pool utilization over a window, request latency
percentiles, KV handoff totals, and the console's dashboard (everything its main screen shows, in one
call).

A window is [now - window_s, now) on the samples' start times; rates are per second of the time
each worker was covered by samples, so a worker started 10 s ago is not diluted by a 60 s window.
"""

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleetctl.domain import WorkerRole, WorkerState
from fleetctl.store.records import WorkerSample, columns

if TYPE_CHECKING:  # sqlite_utils takes 0.1 s to import: `percentiles` is read by the CLI's and the console's start
    from sqlite_utils import Database


@dataclass(frozen=True)
class Utilization:
    seconds: float  # worker-seconds covered by samples
    steps: int
    busy: float  # 0..1
    mfu: float
    mbu: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    queue: float  # mean requests waiting (summed over a pool's workers)
    batch_size: float  # mean sequences per step
    kv_usage: float  # mean fraction of the KV pool in use

    @property
    def tokens_per_s(self) -> float:
        return self.prefill_tokens_per_s + self.decode_tokens_per_s


@dataclass(frozen=True)
class WorkerUtilization:
    worker_id: str
    role: WorkerRole
    window: Utilization


@dataclass(frozen=True)
class PoolUtilization:
    role: WorkerRole
    workers: int
    window: Utilization

    def as_json(self) -> dict[str, float | int]:
        """The `pools.<role>` object of `fleetctl status --json`."""
        w = self.window
        return {"workers": self.workers, "busy": w.busy, "mfu": w.mfu, "mbu": w.mbu, "queue": w.queue}


# Driven from the workers table (CROSS JOIN fixes that order): each worker's rows are one range of
# the (worker_id, ts) index, already grouped, so the GROUP BY needs no sort — 2-3x faster over an
# hour of rows. The writer refuses samples of workers it has no row for, so none is missed.
_UTILIZATION_SQL = """
SELECT w.id, w.role, TOTAL(s.interval_s), TOTAL(s.steps), TOTAL(s.busy * s.interval_s), TOTAL(s.mfu * s.interval_s),
       TOTAL(s.mbu * s.interval_s), TOTAL(s.prefill_tokens), TOTAL(s.decode_tokens), TOTAL(s.queue * s.interval_s),
       TOTAL(s.batch_size * s.steps), TOTAL(s.kv_usage * s.interval_s)
FROM workers w CROSS JOIN worker_samples s ON s.worker_id = w.id AND s.ts >= ? AND s.ts < ?
GROUP BY w.id ORDER BY w.id
"""


def worker_utilization(db: "Database", window_s: float, now: float | None = None) -> list[WorkerUtilization]:
    now = time.time() if now is None else now
    result = []
    for worker_id, role, secs, steps, busy, mfu, mbu, ptok, dtok, queue, batch, kv in db.execute(
        _UTILIZATION_SQL, [now - window_s, now]
    ):
        window = Utilization(secs, int(steps), busy / secs, mfu / secs, mbu / secs, ptok / secs, dtok / secs,
                             queue / secs, batch / steps if steps else 0.0, kv / secs)
        result.append(WorkerUtilization(worker_id, WorkerRole(role), window))
    return result


def pool_utilization(db: "Database", window_s: float, now: float | None = None) -> dict[WorkerRole, PoolUtilization]:
    return _pools(worker_utilization(db, window_s, now))


def _pools(workers: list[WorkerUtilization]) -> dict[WorkerRole, PoolUtilization]:
    """Fractions are means weighted by covered seconds (batch size by steps); rates and queues add."""
    pools = {}
    for role in WorkerRole:
        members = [w.window for w in workers if w.role is role]
        if not members:
            continue
        steps = sum(m.steps for m in members)
        window = Utilization(
            seconds=sum(m.seconds for m in members),
            steps=steps,
            busy=_time_weighted(members, "busy"),
            mfu=_time_weighted(members, "mfu"),
            mbu=_time_weighted(members, "mbu"),
            prefill_tokens_per_s=sum(m.prefill_tokens_per_s for m in members),
            decode_tokens_per_s=sum(m.decode_tokens_per_s for m in members),
            queue=sum(m.queue for m in members),
            batch_size=sum(m.batch_size * m.steps for m in members) / steps if steps else 0.0,
            kv_usage=_time_weighted(members, "kv_usage"),
        )
        pools[role] = PoolUtilization(role, len(members), window)
    return pools


def _time_weighted(members: list[Utilization], attr: str) -> float:
    return sum(getattr(m, attr) * m.seconds for m in members) / sum(m.seconds for m in members)


@dataclass(frozen=True)
class Percentiles:
    p50: float | None  # None when the window holds no request
    p90: float | None
    p99: float | None


@dataclass(frozen=True)
class RequestLatency:
    requests: int  # successful requests that arrived in the window
    ttft: Percentiles
    tpot: Percentiles  # (e2e - ttft) / (output_tokens - 1), over requests with two or more tokens
    e2e: Percentiles


def percentiles(values: list[float]) -> Percentiles:
    """Linear interpolation between the closest ranks (numpy's default)."""
    if not values:
        return Percentiles(None, None, None)
    ordered = sorted(values)

    def at(q: float) -> float:
        pos = q * (len(ordered) - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)

    return Percentiles(at(0.5), at(0.9), at(0.99))


def request_latency(db: "Database", window_s: float, now: float | None = None) -> RequestLatency:
    now = time.time() if now is None else now
    rows = db.execute(
        "SELECT ttft_s, e2e_s, output_tokens FROM requests WHERE ts >= ? AND ts < ? AND outcome = 'ok'",
        [now - window_s, now],
    ).fetchall()
    tpot = [(e2e - ttft) / (out - 1) for ttft, e2e, out in rows if out > 1]
    return RequestLatency(len(rows), percentiles([r[0] for r in rows]), percentiles(tpot),
                          percentiles([r[1] for r in rows]))


@dataclass(frozen=True)
class HandoffTotals:
    count: int  # requests that arrived in the window and had their KV handed off (any outcome)
    bytes: int
    seconds: float
    share_of_e2e: float  # handoff seconds over e2e seconds, of the requests that finished ok


def handoff_totals(db: "Database", window_s: float, now: float | None = None) -> HandoffTotals:
    now = time.time() if now is None else now
    count, nbytes, seconds, ok_handoff, ok_e2e = db.execute(
        "SELECT TOTAL(handoff_bytes > 0), TOTAL(handoff_bytes), TOTAL(handoff_s), "
        "TOTAL(CASE WHEN outcome = 'ok' THEN handoff_s END), TOTAL(CASE WHEN outcome = 'ok' THEN e2e_s END) "
        "FROM requests WHERE ts >= ? AND ts < ?",
        [now - window_s, now],
    ).fetchone()
    return HandoffTotals(int(count), int(nbytes), seconds, ok_handoff / ok_e2e if ok_e2e else 0.0)


@dataclass(frozen=True)
class DashboardWorker:
    """A worker as the dashboard shows it: its row, latest sample and window (the fleet router's
    `WorkerView` is the controller's live view, a different thing)."""

    id: str
    role: WorkerRole
    device: str
    state: WorkerState
    pid: int | None
    latest: WorkerSample | None  # the newest row in the window
    window: Utilization | None  # None when the worker has no row in the window


@dataclass(frozen=True)
class Dashboard:
    now: float
    window_s: float
    workers: list[DashboardWorker]
    pools: dict[WorkerRole, PoolUtilization]


_SAMPLE_COLUMNS = columns(WorkerSample)
_LATEST_SQL = f"""
SELECT {", ".join("s." + c for c in _SAMPLE_COLUMNS)} FROM workers w CROSS JOIN worker_samples s
  ON s.id = (SELECT id FROM worker_samples WHERE worker_id = w.id AND ts >= ? AND ts < ? ORDER BY ts DESC LIMIT 1)
"""


def dashboard(db: "Database", window_s: float = 60.0, now: float | None = None) -> Dashboard:
    """Workers that were running at any point in the window, each with its latest row and its
    utilization over the window, plus the per-pool aggregates."""
    now = time.time() if now is None else now
    since = now - window_s
    latest = {}
    for row in db.execute(_LATEST_SQL, [since, now]):
        values = dict(zip(_SAMPLE_COLUMNS, row, strict=True))
        values["role"] = WorkerRole(values["role"])
        latest[values["worker_id"]] = WorkerSample(**values)
    utilization = worker_utilization(db, window_s, now)
    windows = {w.worker_id: w.window for w in utilization}
    workers = [
        DashboardWorker(wid, WorkerRole(role), device, WorkerState(state), pid, latest.get(wid), windows.get(wid))
        for wid, role, device, state, pid in db.execute(
            "SELECT id, role, device, state, pid FROM workers WHERE stopped_at IS NULL OR stopped_at >= ? "
            "ORDER BY role, id",
            [since],
        )
    ]
    return Dashboard(now, window_s, workers, _pools(utilization))
