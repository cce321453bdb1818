"""The writer on a store whose disk refuses writes: rows are kept (up to the cap) while it is full, the writer says
it is failing and why, and everything kept is written once there is room again. The full disk is a real tmpfs
where this machine lets the tests mount one; elsewhere the connection refuses writes with the error a full disk
gives (sqlite's "database or disk is full")."""

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from support.volumes import StoreDisk, store_disk
from test_writer import FAST, sample, worker

from fleetctl.store.db import open_db
from fleetctl.store.writer import MetricsWriter, WriterConfig


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[StoreDisk]:
    with store_disk(tmp_path) as found:
        yield found


def until(condition: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the writer never got there"
        time.sleep(0.02)


@contextmanager
def started(disk: StoreDisk, config: WriterConfig) -> Iterator[MetricsWriter]:
    with MetricsWriter(disk.store, config) as writer:
        writer.add(worker())
        writer.flush()
        yield writer


def test_a_full_disk_keeps_the_rows_until_there_is_room(disk: StoreDisk) -> None:
    with started(disk, FAST) as writer:
        disk.fill(writer)
        accepted = writer.add_all(sample(float(ts)) for ts in range(3000))  # pages the full disk cannot take
        assert accepted == 3000
        until(lambda: writer.health is not None)
        failure = writer.health
        assert f"the store {disk.store} cannot be written: its disk is full" in failure.error
        assert failure.kept_rows == 3000 and writer.stats.dropped == {}
        time.sleep(0.3)  # several refused flushes later, still failing and still keeping everything
        assert writer.health.since == failure.since and writer.health.kept_rows == 3000
        disk.free()
        until(lambda: writer.health is None)
        assert writer.stats.written["worker_samples"] == 3000
    db = open_db(disk.store)
    assert db["worker_samples"].count == 3000
    db.close()


def test_what_is_kept_is_capped(disk: StoreDisk) -> None:
    capped = WriterConfig(flush_interval_s=0.05, batch_rows=50, max_pending_rows=100, retention=None)
    with started(disk, capped) as writer:
        disk.fill(writer)
        for ts in range(300):
            writer.add(sample(float(ts)))
            if ts % 50 == 0:
                time.sleep(0.06)  # let refused flushes happen in between
        until(lambda: writer.health is not None)
        assert writer.health.kept_rows <= 100
        assert writer.stats.dropped["worker_samples"] + writer.health.kept_rows == 300
        disk.free()
        until(lambda: writer.health is None)
        assert writer.stats.written["worker_samples"] == 300 - writer.stats.dropped["worker_samples"]
