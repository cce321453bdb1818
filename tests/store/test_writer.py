"""The batched writer: every table written, bad rows rejected without stopping it, and readers in
other threads and processes never see "database is locked" while it flushes."""

import logging
import math
import subprocess
import sys
import threading
import time

import pytest

from fleetctl.domain import DeviceKind, EventKind, PeakSource, RequestOutcome, WorkerRole, WorkerState
from fleetctl.store.db import open_db
from fleetctl.store.queries import dashboard
from fleetctl.store.records import (
    BenchRun,
    DeviceRecord,
    EventRecord,
    GpuSample,
    RequestRecord,
    WorkerRecord,
    WorkerSample,
)
from fleetctl.store.writer import MetricsWriter, WriterConfig

FAST = WriterConfig(flush_interval_s=0.05, batch_rows=500, retention=None)


def worker(wid: str = "decode-0", role: WorkerRole = WorkerRole.DECODE) -> WorkerRecord:
    return WorkerRecord(wid, role, "cpu:0", 4242, WorkerState.RUNNING, started_at=0.0)


def sample(ts: float, wid: str = "decode-0", **changes: object) -> WorkerSample:
    values: dict = dict(ts=ts, worker_id=wid, role=WorkerRole.DECODE, interval_s=1.0, busy=0.5, steps=10,
                        prefill_tokens=0, decode_tokens=80, flops=10**12, bytes=10**9, mfu=0.2, mbu=0.6,
                        batch_size=8.0, kv_usage=0.3, queue=1.0)
    values.update(changes)
    return WorkerSample(**values)


def request(rid: str, ts: float = 1.0) -> RequestRecord:
    return RequestRecord(rid, ts, 0.01, 0.2, 4096, 0.001, 0.21, 1.0, 1.21, 100, 20, "prefill-0", "decode-0",
                         RequestOutcome.OK, 0.2, 0.05)


def test_every_table_is_written(tmp_path):
    path = tmp_path / "fleet.db"
    with MetricsWriter(path, FAST) as writer:
        assert writer.add(worker())
        assert writer.add(DeviceRecord("cpu:X:2threads", "float32", DeviceKind.CPU, "X", None, 1e11, 2e10,
                                       PeakSource.CALIBRATED, 5.0))
        assert writer.add(sample(1.0))
        assert writer.add(GpuSample(1.0, 0, 1.0, 0.9, 0.5, 10**9, 300.0))
        assert writer.add(GpuSample(1.0, 1, 1.0, 0.9, 0.5, 10**9, None))
        assert writer.add(request("r-1"))
        assert writer.add(EventRecord(2.0, EventKind.MIGRATE, "decode-0", {"to": "cpu:1", "sessions": 3}))
        assert writer.add(BenchRun(3.0, "chat", {"rate": 2}, {"goodput_rps": 1.5}))
        # a worker row written again replaces the first (state changes)
        assert writer.add(WorkerRecord("decode-0", WorkerRole.DECODE, "cpu:0", 4242, WorkerState.STOPPED, 0.0, 9.0))
    db = open_db(path)
    counts = {t: db[t].count for t in db.table_names()}
    assert counts == {"devices": 1, "workers": 1, "worker_samples": 1, "gpu_samples": 2, "requests": 1,
                      "events": 1, "bench_runs": 1}
    assert next(db.query("SELECT state, stopped_at FROM workers")) == {"state": "stopped", "stopped_at": 9.0}
    assert next(db.query("SELECT details FROM events"))["details"] == '{"to": "cpu:1", "sessions": 3}'


def test_background_thread_flushes_without_being_asked(tmp_path):
    path = tmp_path / "fleet.db"
    writer = MetricsWriter(path, FAST)
    writer.add(worker())
    writer.add_all(sample(float(i)) for i in range(10))
    reader = open_db(path)
    deadline = time.monotonic() + 5
    while reader["worker_samples"].count < 10 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert reader["worker_samples"].count == 10
    writer.close()
    with pytest.raises(RuntimeError, match="closed"):
        writer.add(sample(99.0))


@pytest.mark.parametrize(
    "bad",
    [
        sample(1.0, wid="ghost-7"),  # a worker the store has never seen
        sample(1.0, busy=math.nan),
        sample(1.0, mfu=math.inf),
        sample(1.0, decode_tokens=-3),
        sample(1.0, busy=1.5),  # a fraction above 1
        sample(1.0, flops=1.5e12),  # int columns take ints: downsampled sums must stay exact
        sample(1.0, queue="three"),
        sample(1.0, interval_s=0.0),
        sample(1.0, role="encoder"),
        sample(1.0, kv_usage=None),
    ],
)
def test_bad_samples_are_rejected_and_counted(tmp_path, bad, caplog):
    with MetricsWriter(tmp_path / "fleet.db", FAST) as writer:
        writer.add(worker())
        with caplog.at_level(logging.WARNING, logger="fleetctl.store.writer"):
            assert writer.add(bad) is False
        assert writer.add(sample(2.0))
        writer.flush()
        assert writer.stats.rejected == {"worker_samples": 1}
        assert writer.stats.written == {"workers": 1, "worker_samples": 1}
    assert "rejected worker_samples row" in caplog.text


def test_a_failing_table_loses_only_its_rows_and_the_thread_survives(tmp_path, caplog):
    path = tmp_path / "fleet.db"
    with MetricsWriter(path, FAST) as writer:
        writer.add(worker())
        writer.add(request("dup"))
        writer.flush()
        with caplog.at_level(logging.ERROR, logger="fleetctl.store.writer"):
            writer.add(request("dup"))  # the primary key already exists: the insert fails
            writer.add(sample(5.0))
            writer.flush()
        assert writer.stats.dropped == {"requests": 1}
        assert "writing 1 requests rows failed" in caplog.text
        writer.add(sample(6.0))  # the background thread still writes
        deadline = time.monotonic() + 5
        while writer.stats.written.get("worker_samples", 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert writer.stats.written["worker_samples"] == 2


_PROCESS_READER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], timeout=10, isolation_level=None)
reads = errors = 0
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    try:
        conn.execute("SELECT COUNT(*), TOTAL(flops) FROM worker_samples WHERE ts >= 0").fetchone()
        reads += 1
    except sqlite3.OperationalError as exc:
        errors += 1
        print(exc, file=sys.stderr)
print(reads, errors)
"""


def test_concurrent_readers_never_see_a_locked_database(tmp_path):
    path = tmp_path / "fleet.db"
    writer = MetricsWriter(path, WriterConfig(flush_interval_s=0.01, batch_rows=200, retention=None))
    workers = [f"decode-{i}" for i in range(8)]
    for wid in workers:
        writer.add(worker(wid))
    writer.flush()
    process = subprocess.Popen([sys.executable, "-c", _PROCESS_READER, str(path), "2.0"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stop = threading.Event()
    thread_reads: list[int] = []
    thread_errors: list[BaseException] = []

    def read_loop() -> None:
        db = open_db(path)
        try:
            while not stop.is_set():
                dashboard(db, window_s=60.0, now=10_000.0)
                thread_reads.append(1)
        except BaseException as exc:
            thread_errors.append(exc)
        finally:
            db.close()

    reader = threading.Thread(target=read_loop)
    reader.start()
    total = 0
    for second in range(750):  # 6000 rows in ~1.5 s: dozens of flushes interleave with the reads
        writer.add_all(sample(float(second), wid=wid) for wid in workers)
        total += len(workers)
        if second % 25 == 0:
            time.sleep(0.05)
    writer.close()
    out, err = process.communicate(timeout=30)
    stop.set()
    reader.join(timeout=30)

    assert thread_errors == []
    assert len(thread_reads) > 5
    reads, errors = map(int, out.split())
    assert (errors, err) == (0, "")
    assert reads > 5
    assert writer.stats.written["worker_samples"] == total
    assert open_db(path)["worker_samples"].count == total
