"""Retention: raw 1 s samples older than an hour are merged into 10 s rows; samples and requests
older than a week are deleted. Events, workers, devices and bench runs are kept.

Merging sums the counters (steps, tokens, FLOPs, bytes: all integer columns, so totals are kept
exactly) and averages the rates and gauges weighted by each row's interval (batch size by steps).
A bucket holding a single row is left as it is: it already is its own merge.
"""

import math
import time
from dataclasses import dataclass

from sqlite_utils import Database


@dataclass(frozen=True)
class RetentionConfig:
    raw_keep_s: float = 3600.0  # samples younger than this stay at full resolution
    bucket_s: float = 10.0  # width of a downsampled row
    keep_s: float = 7 * 86400.0  # samples and requests older than this are deleted

    def __post_init__(self) -> None:
        if not self.bucket_s >= 1:
            raise ValueError(f"bucket_s must be at least 1 s, got {self.bucket_s}")
        if not 0 < self.raw_keep_s < self.keep_s:
            raise ValueError("need 0 < raw_keep_s < keep_s")


@dataclass(frozen=True)
class RetentionResult:
    cutoff: float  # rows before this were examined; pass it as `since` to the next run
    merged_rows: int  # raw rows replaced by downsampled ones
    written_rows: int  # downsampled rows written
    deleted_rows: int  # rows past keep_s


_MEAN = "SUM({col} * interval_s) / SUM(interval_s)"
_WORKER_COLUMNS = {  # column -> how a bucket's rows combine into one
    "interval_s": "SUM(interval_s)",
    "busy": _MEAN.format(col="busy"),
    "steps": "SUM(steps)",
    "prefill_tokens": "SUM(prefill_tokens)",
    "decode_tokens": "SUM(decode_tokens)",
    "flops": "SUM(flops)",
    "bytes": "SUM(bytes)",
    "mfu": _MEAN.format(col="mfu"),
    "mbu": _MEAN.format(col="mbu"),
    "batch_size": "COALESCE(SUM(batch_size * steps) / NULLIF(SUM(steps), 0), 0.0)",
    "kv_usage": _MEAN.format(col="kv_usage"),
    "queue": _MEAN.format(col="queue"),
}
_GPU_COLUMNS = {
    "interval_s": "SUM(interval_s)",
    "sm_util": _MEAN.format(col="sm_util"),
    "mem_util": _MEAN.format(col="mem_util"),
    "mem_used_bytes": "CAST(ROUND(" + _MEAN.format(col="mem_used_bytes") + ") AS INTEGER)",
    # NULL power (not reported) stays out of both sums
    "power_w": "SUM(power_w * interval_s) / SUM(CASE WHEN power_w IS NULL THEN NULL ELSE interval_s END)",
}


def _downsample(db: Database, table: str, keys: tuple[str, ...], combine: dict[str, str],
                since: float, cutoff: float, bucket_s: float) -> tuple[int, int]:
    key_cols = ", ".join(keys)
    bucket = "CAST(ts / :bucket AS INTEGER)"
    window = "ts >= :since AND ts < :cutoff"
    params = {"bucket": bucket_s, "since": since, "cutoff": cutoff}
    params["max_id"] = db.execute(f"SELECT COALESCE(MAX(id), 0) FROM {table}").fetchone()[0]
    written = db.execute(
        f"INSERT INTO {table} (ts, {key_cols}, {', '.join(combine)}) "
        f"SELECT {bucket} * :bucket, {key_cols}, {', '.join(combine.values())} "
        f"FROM {table} WHERE {window} GROUP BY {key_cols}, {bucket} HAVING COUNT(*) > 1",
        params,
    ).rowcount
    merged = db.execute(
        f"DELETE FROM {table} WHERE id <= :max_id AND {window} AND ({keys[0]}, {bucket}) IN "
        f"(SELECT {keys[0]}, {bucket} FROM {table} WHERE id <= :max_id AND {window} "
        f"GROUP BY {keys[0]}, {bucket} HAVING COUNT(*) > 1)",
        params,
    ).rowcount
    return merged, written


def apply_retention(db: Database, config: RetentionConfig, now: float | None = None,
                    since: float = 0.0) -> RetentionResult:
    """Downsample and delete in one write transaction. `since` skips rows already examined by an
    earlier run (its `cutoff`); rows that arrive later than that are kept at full resolution."""
    now = time.time() if now is None else now
    cutoff = math.floor((now - config.raw_keep_s) / config.bucket_s) * config.bucket_s  # whole buckets only
    expiry = now - config.keep_s
    merged = written = deleted = 0
    db.execute("BEGIN IMMEDIATE")  # reads then writes: take the write lock first
    try:
        for table, keys, combine in (
            ("worker_samples", ("worker_id", "role"), _WORKER_COLUMNS),
            ("gpu_samples", ("device_index",), _GPU_COLUMNS),
        ):
            m, w = _downsample(db, table, keys, combine, since, cutoff, config.bucket_s)
            merged, written = merged + m, written + w
        for table in ("worker_samples", "gpu_samples", "requests"):
            deleted += db.execute(f"DELETE FROM {table} WHERE ts < ?", [expiry]).rowcount
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return RetentionResult(cutoff, merged, written, deleted)
