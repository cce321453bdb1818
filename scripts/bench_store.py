"""Metrics store throughput: samples/s through the batched writer (validation, queue, background
flushes, commit; target ≥ 20,000/s), and over one hour of 8 workers at 1 Hz (with 5 requests/s and an
event a minute) the console's dashboard query, for the default 60 s window and the whole hour (target
≤ 20 ms), and `history` (what GET /fleet/history returns) for the console's 300 s in 5 s buckets (target
≤ 20 ms) and, for reference, the whole hour in 60 s buckets (it reads every sample and request row of the
hour: 28,800 + 18,000).

    python scripts/bench_store.py [--samples 200000] [--workers 8] [--repeats 50]
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from fleetctl.domain import EventKind, RequestOutcome, WorkerRole, WorkerState
from fleetctl.store.db import open_db
from fleetctl.store.history import history
from fleetctl.store.queries import dashboard
from fleetctl.store.records import EventRecord, RequestRecord, WorkerRecord, WorkerSample
from fleetctl.store.writer import MetricsWriter, WriterConfig

HOUR = 3600
REQUESTS_PER_S = 5


def workers(count: int) -> list[WorkerRecord]:
    roles = [WorkerRole.PREFILL if i < count // 4 else WorkerRole.DECODE for i in range(count)]
    return [WorkerRecord(f"{r}-{i}", r, f"cuda:{i}", 1000 + i, WorkerState.RUNNING, 0.0) for i, r in enumerate(roles)]


def samples(fleet: list[WorkerRecord], seconds: int, start: float) -> list[WorkerSample]:
    rows = []
    for s in range(seconds):
        for i, w in enumerate(fleet):
            prefill = w.role is WorkerRole.PREFILL
            busy = ((s * 7 + i * 13) % 100) / 100
            rows.append(WorkerSample(
                ts=start + s, worker_id=w.id, role=w.role, interval_s=1.0, busy=busy, steps=20 + s % 7,
                prefill_tokens=4096 if prefill else 0, decode_tokens=0 if prefill else 256,
                flops=(s + 1) * 10**12, bytes=(i + 1) * 10**10, mfu=busy * 0.5, mbu=busy * 0.7,
                batch_size=float(1 + (s + i) % 32), kv_usage=busy * 0.9, queue=float(s % 5),
            ))
    return rows


def requests(seconds: int, start: float) -> list[RequestRecord]:
    rows = []
    for i in range(seconds * REQUESTS_PER_S):
        prompt, output = 64 + (i * 37) % 2000, 16 + (i * 11) % 500
        ttft, e2e = 0.05 + (i % 13) / 100, 1.0 + (i % 29) / 10
        rows.append(RequestRecord(
            request_id=f"req-{i}", ts=start + i / REQUESTS_PER_S, queue_s=0.01, prefill_s=ttft,
            handoff_bytes=prompt * 36_864, handoff_s=0.002, ttft_s=ttft, decode_s=e2e - ttft, e2e_s=e2e,
            prompt_tokens=prompt, output_tokens=output,
            prefill_worker="prefill-0", decode_worker="decode-2", outcome=RequestOutcome.OK,
            prefill_model_s=prompt / 40_000, decode_model_s=output / 800,
        ))
    return rows


def events(seconds: int, start: float) -> list[EventRecord]:
    return [EventRecord(start + s, EventKind.MIGRATE, "decode-2", {"from": "cuda:2", "to": "cuda:3"})
            for s in range(0, seconds, 60)]


def ingest_rate(path: Path, fleet: list[WorkerRecord], total: int) -> float:
    """Samples per second from the first add to the last row committed, records built beforehand."""
    rows = samples(fleet, total // len(fleet), start=time.time() - total // len(fleet))
    writer = MetricsWriter(path, WriterConfig(retention=None))
    writer.add_all(fleet)
    writer.flush()
    start = time.perf_counter()
    accepted = writer.add_all(rows)
    writer.close()
    elapsed = time.perf_counter() - start
    stats = writer.stats
    assert accepted == len(rows) == stats.written["worker_samples"], stats
    return len(rows) / elapsed


def dashboard_ms(path: Path, window_s: float, now: float, repeats: int) -> float:
    db = open_db(path)
    dashboard(db, window_s, now)  # warm the page cache
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        view = dashboard(db, window_s, now)
        times.append(time.perf_counter() - start)
    assert len(view.workers) > 0 and all(w.latest is not None for w in view.workers)
    db.close()
    return statistics.median(times) * 1000


def history_ms(path: Path, window_s: float, bucket_s: float, now: float, repeats: int) -> float:
    db = open_db(path)
    history(db, window_s, bucket_s, now)  # warm the page cache
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        view = history(db, window_s, bucket_s, now)
        times.append(time.perf_counter() - start)
    assert all(len(series) == round(window_s / bucket_s) for series in view["workers"].values())
    assert view["traffic"]["requests"] > 0 and view["events"]
    db.close()
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    fleet = workers(args.workers)
    with tempfile.TemporaryDirectory() as tmp:
        rate = ingest_rate(Path(tmp) / "ingest.db", fleet, args.samples)
        print(f"ingest: {rate:,.0f} worker samples/s through MetricsWriter ({args.samples:,} samples; target ≥ 20,000)")

        path = Path(tmp) / "hour.db"
        now = time.time()
        with MetricsWriter(path, WriterConfig(retention=None)) as writer:
            writer.add_all(fleet)
            writer.add_all(samples(fleet, HOUR, start=now - HOUR))
            writer.add_all(requests(HOUR, start=now - HOUR))
            writer.add_all(events(HOUR, start=now - HOUR))
        for window in (60.0, float(HOUR)):
            ms = dashboard_ms(path, window, now, args.repeats)
            print(f"dashboard: {ms:.2f} ms median over {args.repeats} calls, {args.workers} workers × 1 h at 1 Hz "
                  f"({args.workers * HOUR:,} rows), {window:.0f} s window (target ≤ 20 ms)")
        for window, bucket, target in ((300.0, 5.0, "target ≤ 20 ms"), (float(HOUR), 60.0, "for reference")):
            ms = history_ms(path, window, bucket, now, args.repeats)
            print(f"history: {ms:.2f} ms median over {args.repeats} calls, {window:.0f} s in {bucket:.0f} s buckets, "
                  f"{args.workers} workers × 1 h at 1 Hz and {REQUESTS_PER_S} requests/s ({target})")


if __name__ == "__main__":
    main()
