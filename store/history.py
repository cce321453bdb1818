"""History for consoles: everything a dashboard draws from the store, in one call — per-pool and
per-worker series (busy, MFU, MBU, tokens/s) and the TTFT/TPOT percentiles of the requests that arrived in
each bucket, in fixed buckets, the traffic summary of the window, and its latest events.

Buckets are aligned to multiples of `bucket_s` since the epoch, the last one holding `now` (still
filling): a console that polls gets the same x positions each time, and every bucket is present
(zeros where nothing ran). A sample falls in the bucket its start time falls in. Within a bucket the
conventions of `queries` hold: fractions are means weighted by covered seconds, and rates are per
covered second (a bucket still filling, or a worker started inside it, is not diluted), a pool's
tokens/s the sum of its workers'.
"""

import json
import math
import time

from sqlite_utils import Database

from fleetctl.errors import UserError
from fleetctl.store.classify import classify
from fleetctl.store.queries import percentiles, request_latency

MAX_BUCKETS = 20_000
MAX_EVENTS = 50
_FIELDS = ("busy", "mfu", "mbu", "tokens_per_s")


# Workers that ran at some point in the window, as queries.dashboard lists them.
_WORKERS_SQL = "SELECT id, role FROM workers WHERE started_at < ? AND (stopped_at IS NULL OR stopped_at >= ?)"

# Driven from the workers table over the (worker_id, ts, …) covering index, as queries._UTILIZATION_SQL.
_BUCKETS_SQL = """
SELECT w.id, CAST((s.ts - :first) / :bucket AS INTEGER) AS k, TOTAL(s.interval_s), TOTAL(s.busy * s.interval_s),
       TOTAL(s.mfu * s.interval_s), TOTAL(s.mbu * s.interval_s), TOTAL(s.prefill_tokens + s.decode_tokens)
FROM workers w CROSS JOIN worker_samples s ON s.worker_id = w.id AND s.ts >= :first AND s.ts < :now
GROUP BY w.id, k
"""

_LATENCY_SQL = "SELECT ts, ttft_s, e2e_s, output_tokens FROM requests WHERE ts >= ? AND ts < ? AND outcome = 'ok'"

_HANDOFF_SQL = "SELECT TOTAL(handoff_bytes), TOTAL(handoff_s), TOTAL(e2e_s) FROM requests WHERE ts >= ? AND ts < ?"

_EVENTS_SQL = """
SELECT ts, kind, worker_id, details FROM events WHERE ts >= ? AND ts < ? ORDER BY ts DESC, id DESC LIMIT ?
"""


def bucket_starts(window_s: float, bucket_s: float, now: float) -> list[float]:
    """The start of each bucket, oldest first: ceil(window_s / bucket_s) of them, the last holding `now`."""
    if not (window_s > 0 and bucket_s > 0 and math.isfinite(window_s) and math.isfinite(bucket_s)):
        raise UserError("window and bucket must be positive numbers of seconds")
    count = math.ceil(window_s / bucket_s)
    if count > MAX_BUCKETS:
        raise UserError(f"a {window_s:g} s window in {bucket_s:g} s buckets is {count} points; at most "
                        f"{MAX_BUCKETS}: use a larger bucket")
    last = math.floor(now / bucket_s)
    return [(last - count + 1 + k) * bucket_s for k in range(count)]


def history(db: Database, window_s: float, bucket_s: float, now: float | None = None) -> dict:
    now = time.time() if now is None else now
    starts = bucket_starts(window_s, bucket_s, now)
    since = now - window_s
    roles = dict(db.execute(_WORKERS_SQL, [now, since]).fetchall())
    # worker -> bucket index -> (covered seconds, busy·s, mfu·s, mbu·s, tokens)
    sums: dict[str, dict[int, tuple[float, ...]]] = {wid: {} for wid in roles}
    for wid, k, *values in db.execute(_BUCKETS_SQL, {"first": starts[0], "bucket": bucket_s, "now": now}):
        if wid in sums and 0 <= k < len(starts):
            sums[wid][k] = tuple(values)
    workers = {wid: [_point(ts, [by_bucket[k]] if k in by_bucket else []) for k, ts in enumerate(starts)]
               for wid, by_bucket in sums.items()}
    pools = {}
    for role in sorted(set(roles.values())):
        members = [sums[wid] for wid in sorted(roles) if roles[wid] == role]
        pools[role] = [_point(ts, [m[k] for m in members if k in m]) for k, ts in enumerate(starts)]
    return {"now": now, "window_s": window_s, "bucket_s": bucket_s, "pools": pools, "workers": workers,
            "latency": latency_series(db, starts, bucket_s, now), "traffic": traffic(db, window_s, now),
            "events": events(db, since, now)}


def latency_series(db: Database, starts: list[float], bucket_s: float, now: float) -> list[dict]:
    """Per bucket, the TTFT and TPOT p50/p99 of the successful requests that arrived in it (None where none did);
    TPOT as `queries.request_latency` takes it."""
    ttft: list[list[float]] = [[] for _ in starts]
    tpot: list[list[float]] = [[] for _ in starts]
    for ts, ttft_s, e2e_s, output_tokens in db.execute(_LATENCY_SQL, [starts[0], now]):
        k = int((ts - starts[0]) // bucket_s)
        if 0 <= k < len(starts):
            ttft[k].append(ttft_s)
            if output_tokens > 1:
                tpot[k].append((e2e_s - ttft_s) / (output_tokens - 1))
    points = []
    for ts, first, per_token in zip(starts, ttft, tpot, strict=True):
        first_p, token_p = percentiles(first), percentiles(per_token)
        points.append({"ts": ts, "ttft_p50": first_p.p50, "ttft_p99": first_p.p99, "tpot_p50": token_p.p50,
                       "tpot_p99": token_p.p99})
    return points


def _point(ts: float, members: list[tuple[float, ...]]) -> dict[str, float]:
    """One bucket of a worker (one member) or a pool (its workers with samples in the bucket)."""
    seconds = sum(m[0] for m in members)
    if seconds <= 0:
        return {"ts": ts, **dict.fromkeys(_FIELDS, 0.0)}
    return {"ts": ts, "busy": sum(m[1] for m in members) / seconds, "mfu": sum(m[2] for m in members) / seconds,
            "mbu": sum(m[3] for m in members) / seconds,
            "tokens_per_s": sum(m[4] / m[0] for m in members if m[0] > 0)}


def traffic(db: Database, window_s: float, now: float) -> dict:
    """Requests that arrived in [now - window_s, now): rate, latency percentiles (successful ones),
    share of model time by phase, KV handoff volume and its share of end-to-end time."""
    latency = request_latency(db, window_s, now)
    phases = classify(db, window_s, now)
    handoff_bytes, handoff_s, e2e_s = db.execute(_HANDOFF_SQL, [now - window_s, now]).fetchone()
    return {
        "requests": phases.requests,
        "requests_per_s": phases.requests / window_s,
        "ttft_s": {"p50": latency.ttft.p50, "p99": latency.ttft.p99},
        "tpot_s": {"p50": latency.tpot.p50, "p99": latency.tpot.p99},
        "prefill_share": phases.prefill_share,
        "decode_share": phases.decode_share,
        "handoff_bytes_per_s": handoff_bytes / window_s,
        "handoff_share_of_e2e": handoff_s / e2e_s if e2e_s > 0 else 0.0,
    }


def events(db: Database, since: float, now: float, limit: int = MAX_EVENTS) -> list[dict]:
    """The latest `limit` events in [since, now), newest last."""
    rows = db.execute(_EVENTS_SQL, [since, now, limit]).fetchall()
    return [{"ts": ts, "kind": kind, "worker": worker, "details": json.loads(details) if details else {}}
            for ts, kind, worker, details in reversed(rows)]
