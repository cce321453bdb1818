"""Per-step records from the workers, folded into one row per worker per second.

Conventions (the console's whole picture rests on them):
- busy = model-step seconds in the second ÷ the second's wall time (the covered part of it, for a
  worker's first and last second). Never above 1 by construction (see the last point), never clamped.
- mfu = FLOPs in the second ÷ wall time ÷ peak FLOP/s: over wall time, not busy
  time, so an idle worker shows low MFU. mfu / busy is the rate while stepping. mbu likewise, bytes.
- A step that spans a second boundary is split by time: its busy seconds, FLOPs and bytes go to
  each second in proportion to the overlap (FLOPs and bytes stay whole numbers that add up to the
  step's). Its step count, tokens and batch size go to the second in which it ended.
- kv_usage and queue are gauges: the value after the last step that ended in the second, carried
  forward through idle seconds.
- A second stays open for the worker's longest step so far (plus grace_s, at most MAX_GRACE_S), so a
  long prefill finds the seconds it ran in. A step that still arrives after its seconds were emitted
  spills into the oldest open seconds, each filled only up to its length: no token or FLOP is lost,
  and no second reads busier than it was long.
"""

import logging
import math
from dataclasses import dataclass, field

from fleetctl.domain import Phase, WorkerRole
from fleetctl.store.records import WorkerSample

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StepRecord:
    worker_id: str
    ts: float  # wall clock (time.time()) when the step ended
    busy_s: float  # the step's duration
    phase: Phase
    tokens: int  # tokens run through the model
    flops: float
    bytes: float
    batch_size: int  # sequences in the step
    kv_usage: float  # fraction of the KV pool in use after the step
    queue: int  # requests waiting for admission after the step


@dataclass(frozen=True)
class AggregatorConfig:
    bucket_s: float = 1.0
    grace_s: float = 1.0  # how long a second stays open for steps reported late

    def __post_init__(self) -> None:
        if self.bucket_s <= 0 or self.grace_s < 0:
            raise ValueError("bucket_s must be positive and grace_s non-negative")


@dataclass(slots=True)
class _Bucket:
    busy_s: float = 0.0
    steps: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    flops: int = 0
    bytes: int = 0
    batch_sum: int = 0
    gauge_ts: float = -math.inf
    kv_usage: float = 0.0
    queue: int = 0

    def add(self, seconds: float, flops: int, nbytes: int) -> None:
        self.busy_s += seconds
        self.flops += flops
        self.bytes += nbytes


@dataclass(slots=True)
class _Worker:
    role: WorkerRole
    peak_flops: float
    peak_bytes_per_s: float
    since: float
    next_bucket: int  # the oldest bucket not yet emitted
    stopped_at: float | None = None
    longest_step_s: float = 0.0
    kv_usage: float = 0.0
    queue: int = 0
    buckets: dict[int, _Bucket] = field(default_factory=dict)


MAX_GRACE_S = 30.0


class StepAggregator:
    def __init__(self, config: AggregatorConfig | None = None) -> None:
        self.config = config or AggregatorConfig()
        self._workers: dict[str, _Worker] = {}
        self.dropped_steps = 0  # from workers never added (or already stopped), or with bad times

    def add_worker(self, worker_id: str, role: WorkerRole, peak_flops: float, peak_bytes_per_s: float,
                   since: float) -> None:
        if peak_flops <= 0 or peak_bytes_per_s <= 0:
            raise ValueError("device peaks must be positive")
        self._workers[worker_id] = _Worker(role, peak_flops, peak_bytes_per_s, since, self._bucket(since))

    def stop_worker(self, worker_id: str, at: float) -> None:
        """The worker's rows end at `at`; the next collect emits them and forgets the worker."""
        self._workers[worker_id].stopped_at = at

    def add_step(self, step: StepRecord) -> None:
        worker = self._workers.get(step.worker_id)
        if (worker is None or (worker.stopped_at is not None and step.ts > worker.stopped_at)
                or not (math.isfinite(step.ts) and 0 <= step.busy_s < math.inf)):
            self.dropped_steps += 1
            if self.dropped_steps & (self.dropped_steps - 1) == 0:
                log.warning("step dropped (%d so far): %r", self.dropped_steps, step)
            return
        worker.longest_step_s = max(worker.longest_step_s, step.busy_s)
        for k, seconds, flops, nbytes in self._pieces(step):
            self._credit(worker, k, seconds, flops, nbytes)
        bucket = self._open_bucket(worker, self._bucket(step.ts))
        bucket.steps += 1
        bucket.batch_sum += step.batch_size
        if step.phase is Phase.PREFILL:
            bucket.prefill_tokens += step.tokens
        else:
            bucket.decode_tokens += step.tokens
        if step.ts >= bucket.gauge_ts:
            bucket.gauge_ts, bucket.kv_usage, bucket.queue = step.ts, step.kv_usage, step.queue

    def _pieces(self, step: StepRecord) -> list[tuple[int, float, int, int]]:
        """(second, busy seconds, FLOPs, bytes) of the step in each second it overlaps; FLOPs and bytes
        are whole numbers that add up to the step's exactly (the last piece takes the remainder)."""
        start = step.ts - step.busy_s
        first, last = self._bucket(start), self._bucket(step.ts)
        if first == last:
            return [(last, step.busy_s, round(step.flops), round(step.bytes))]
        pieces, flops, nbytes = [], round(step.flops), round(step.bytes)
        for k in range(first, last):
            lo, hi = max(start, k * self.config.bucket_s), (k + 1) * self.config.bucket_s
            share = (hi - lo) / step.busy_s
            part_flops, part_bytes = round(step.flops * share), round(step.bytes * share)
            pieces.append((k, hi - lo, part_flops, part_bytes))
            flops, nbytes = flops - part_flops, nbytes - part_bytes
        return [*pieces, (last, step.ts - last * self.config.bucket_s, flops, nbytes)]

    def _credit(self, worker: _Worker, k: int, seconds: float, flops: int, nbytes: int) -> None:
        """Add busy time to second k — or, for a second already written, to the oldest open one — filling
        each second only up to its length and carrying the rest forward: totals are kept exactly and no
        second is ever busier than it was long."""
        k = max(k, worker.next_bucket)
        while True:
            bucket = self._open_bucket(worker, k)
            room = max(0.0, (k + 1) * self.config.bucket_s - max(k * self.config.bucket_s, worker.since)
                       - bucket.busy_s)
            if seconds <= room + 1e-9:
                bucket.add(seconds, flops, nbytes)
                return
            part_flops, part_bytes = round(flops * room / seconds), round(nbytes * room / seconds)
            bucket.add(room, part_flops, part_bytes)
            seconds, flops, nbytes, k = seconds - room, flops - part_flops, nbytes - part_bytes, k + 1

    def collect(self, now: float) -> list[WorkerSample]:
        """Rows for every second that closed more than grace_s before `now` (or before a stop)."""
        rows: list[WorkerSample] = []
        for worker_id, worker in list(self._workers.items()):
            if worker.stopped_at is None:
                # a second stays open as long as the worker's longest step: a 12 s prefill reports once,
                # at its end, and must still find the seconds it ran in (capped: a dashboard must move)
                grace = min(max(self.config.grace_s, worker.longest_step_s + self.config.grace_s), MAX_GRACE_S)
                end = self._bucket(now - grace)  # buckets before this one are closed
            else:
                end = math.ceil(worker.stopped_at / self.config.bucket_s)
            while worker.next_bucket < end:
                row = self._emit(worker_id, worker, worker.next_bucket)
                if row is not None:
                    rows.append(row)
                worker.next_bucket += 1
            if worker.stopped_at is not None:
                del self._workers[worker_id]
        return rows

    def _bucket(self, ts: float) -> int:
        return math.floor(ts / self.config.bucket_s)

    def _open_bucket(self, worker: _Worker, k: int) -> _Bucket:
        k = max(k, worker.next_bucket)  # late: that second is already written
        return worker.buckets.setdefault(k, _Bucket())

    def _emit(self, worker_id: str, worker: _Worker, k: int) -> WorkerSample | None:
        bucket = worker.buckets.pop(k, None) or _Bucket()
        start = max(k * self.config.bucket_s, worker.since)
        stop = (k + 1) * self.config.bucket_s
        if worker.stopped_at is not None:
            stop = min(stop, worker.stopped_at)
        interval = stop - start
        if interval <= 0:
            return None
        if bucket.steps:
            worker.kv_usage, worker.queue = bucket.kv_usage, bucket.queue
        return WorkerSample(
            ts=start,
            worker_id=worker_id,
            role=worker.role,
            interval_s=interval,
            busy=bucket.busy_s / interval,
            steps=bucket.steps,
            prefill_tokens=bucket.prefill_tokens,
            decode_tokens=bucket.decode_tokens,
            flops=bucket.flops,
            bytes=bucket.bytes,
            mfu=bucket.flops / interval / worker.peak_flops,
            mbu=bucket.bytes / interval / worker.peak_bytes_per_s,
            batch_size=bucket.batch_sum / bucket.steps if bucket.steps else 0.0,
            kv_usage=worker.kv_usage,
            queue=float(worker.queue),
        )
