"""Retention: raw rows past an hour merge into 10 s rows with totals kept exactly; rows past a
week are deleted."""

import random

import pytest

from fleetctl.store.db import open_db
from fleetctl.store.retention import RetentionConfig, apply_retention

HOUR, DAY = 3600.0, 86400.0
START = 1_700_000_000.0  # a multiple of 10: bucket edges fall on whole seconds
TOTALS = ("SELECT worker_id, SUM(steps), SUM(prefill_tokens), SUM(decode_tokens), SUM(flops), SUM(bytes), "
          "TOTAL(interval_s), TOTAL(busy * interval_s), TOTAL(mfu * interval_s), TOTAL(batch_size * steps) "
          "FROM worker_samples GROUP BY worker_id ORDER BY worker_id")


def fill(db, seconds: int, start: float = START, seed: int = 0) -> None:
    rng = random.Random(seed)
    rows = []
    for s in range(seconds):
        for wid, role in (("prefill-0", "prefill"), ("decode-0", "decode")):
            busy = rng.random()
            steps = rng.randrange(0, 40)
            rows.append(dict(ts=start + s, worker_id=wid, role=role, interval_s=1.0, busy=busy, steps=steps,
                             prefill_tokens=rng.randrange(0, 5000) if role == "prefill" else 0,
                             decode_tokens=rng.randrange(0, 300) if role == "decode" else 0,
                             flops=rng.randrange(0, 10**15), bytes=rng.randrange(0, 10**12), mfu=busy * 0.6,
                             mbu=busy * 0.3, batch_size=rng.randrange(1, 33) if steps else 0.0,
                             kv_usage=rng.random(), queue=float(rng.randrange(0, 5))))
    db["worker_samples"].insert_all(rows)


def test_downsampling_keeps_totals_exactly_and_weights_the_means(tmp_path):
    db = open_db(tmp_path / "fleet.db")
    fill(db, seconds=2 * 3600 + 7)
    before = db.execute(TOTALS).fetchall()
    now = START + 2 * HOUR + 7
    result = apply_retention(db, RetentionConfig(), now=now)
    after = db.execute(TOTALS).fetchall()

    for b, a in zip(before, after, strict=True):
        assert a[:6] == b[:6]  # worker, steps, tokens, FLOPs, bytes: integers, equal exactly
        assert a[6:] == pytest.approx(b[6:], rel=1e-12)  # interval-weighted sums of the fractions
    cutoff = result.cutoff
    assert cutoff == START + HOUR
    old = db.execute("SELECT COUNT(*), MIN(interval_s), MAX(interval_s) FROM worker_samples WHERE ts < ?",
                     [cutoff]).fetchone()
    assert old == (2 * 360, 10.0, 10.0)  # one 10 s row per worker per bucket
    assert db.execute("SELECT COUNT(*) FROM worker_samples WHERE ts >= ? AND interval_s = 1", [cutoff]).fetchone()[0] \
        == 2 * (3600 + 7)  # the last hour untouched
    assert (result.merged_rows, result.written_rows, result.deleted_rows) == (2 * 3600, 2 * 360, 0)

    again = apply_retention(db, RetentionConfig(), now=now)  # nothing left to merge
    assert (again.merged_rows, again.written_rows) == (0, 0)
    assert db.execute(TOTALS).fetchall() == after


def test_a_later_run_only_looks_past_the_previous_cutoff(tmp_path):
    db = open_db(tmp_path / "fleet.db")
    fill(db, seconds=3600 + 100)
    first = apply_retention(db, RetentionConfig(), now=START + 3600 + 50)
    assert first.cutoff == START + 50
    second = apply_retention(db, RetentionConfig(), now=START + 3600 + 100, since=first.cutoff)
    assert second.written_rows == 2 * 5  # buckets 50..100 only
    assert db.execute("SELECT COUNT(*) FROM worker_samples WHERE ts < ?", [second.cutoff]).fetchone()[0] == 2 * 10


def test_weighted_means_of_a_partial_bucket(tmp_path):
    db = open_db(tmp_path / "fleet.db")
    base = dict(worker_id="decode-0", role="decode", prefill_tokens=0, decode_tokens=1, flops=1, bytes=1,
                mbu=0.0, kv_usage=0.0, queue=0.0)
    db["worker_samples"].insert_all([
        dict(base, ts=START, interval_s=1.0, busy=1.0, mfu=0.5, steps=1, batch_size=4.0),
        dict(base, ts=START + 1, interval_s=3.0, busy=0.0, mfu=0.1, steps=3, batch_size=8.0),
    ])
    apply_retention(db, RetentionConfig(), now=START + HOUR + 10)
    [row] = db.query("SELECT * FROM worker_samples")
    assert row["ts"] == START and row["interval_s"] == 4.0
    assert row["busy"] == pytest.approx(0.25)
    assert row["mfu"] == pytest.approx((0.5 + 0.3) / 4)
    assert row["batch_size"] == pytest.approx((4 + 24) / 4)  # weighted by steps
    assert row["steps"] == 4 and row["decode_tokens"] == 2


def test_gpu_samples_are_downsampled_with_missing_power_left_out(tmp_path):
    db = open_db(tmp_path / "fleet.db")
    db["gpu_samples"].insert_all(
        dict(ts=START + s, device_index=0, interval_s=1.0, sm_util=s / 10, mem_util=0.5, mem_used_bytes=1000 + 2 * s,
             power_w=None if s % 2 else 100.0 + s)
        for s in range(10)
    )
    apply_retention(db, RetentionConfig(), now=START + HOUR + 10)
    [row] = db.query("SELECT * FROM gpu_samples")
    assert row["interval_s"] == 10.0 and row["sm_util"] == pytest.approx(0.45)
    assert row["mem_used_bytes"] == 1009
    assert row["power_w"] == pytest.approx(104.0)  # mean of the five reported values


def test_rows_past_a_week_are_deleted_and_events_kept(tmp_path):
    db = open_db(tmp_path / "fleet.db")
    now = START + 8 * DAY
    fill(db, seconds=20, start=START)  # eight days old
    fill(db, seconds=20, start=now - 60)
    db["requests"].insert_all([
        dict(request_id=f"r{i}", ts=ts, queue_s=0, prefill_s=0, handoff_bytes=0, handoff_s=0, ttft_s=0, decode_s=0,
             e2e_s=0, prompt_tokens=1, output_tokens=1, outcome="ok", prefill_model_s=0, decode_model_s=0)
        for i, ts in enumerate((START, now - 10))
    ])
    db["events"].insert(dict(ts=START, kind="start", worker_id="decode-0", details="{}"))
    result = apply_retention(db, RetentionConfig(), now=now)
    assert result.deleted_rows == 2 * 2 + 1  # two merged 10 s rows per worker, one request
    assert db.execute("SELECT MIN(ts) FROM worker_samples").fetchone()[0] == now - 60
    assert [r["request_id"] for r in db.query("SELECT request_id FROM requests")] == ["r1"]
    assert db["events"].count == 1


def test_config_is_checked():
    with pytest.raises(ValueError):
        RetentionConfig(raw_keep_s=8 * DAY)
    with pytest.raises(ValueError):
        RetentionConfig(bucket_s=0.5)
