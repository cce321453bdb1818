"""`history`: the console's series, traffic and events in one call, on rows whose numbers are known."""

from pathlib import Path

import pytest

from fleetctl.domain import EventKind, RequestOutcome, WorkerRole, WorkerState
from fleetctl.errors import UserError
from fleetctl.store.db import open_db
from fleetctl.store.history import MAX_BUCKETS, bucket_starts, history
from fleetctl.store.records import EventRecord, RequestRecord, WorkerRecord, WorkerSample
from fleetctl.store.writer import MetricsWriter, WriterConfig

NOW = 10_003.0  # 3 s into the bucket that starts at 10_000
WINDOW, BUCKET = 30.0, 5.0  # buckets start at 9975, 9980, …, 10_000
ZERO = {"busy": 0.0, "mfu": 0.0, "mbu": 0.0, "tokens_per_s": 0.0}


def sample(ts: float, wid: str, role: WorkerRole, busy: float, tokens: int, interval: float = 1.0,
           mfu: float = 0.0, mbu: float = 0.0) -> WorkerSample:
    prefill = tokens if role is WorkerRole.PREFILL else 0
    return WorkerSample(ts, wid, role, interval, busy, 10, prefill, tokens - prefill, 10**9, 10**8, mfu, mbu, 4.0,
                        0.5, 0.0)


def request(rid: str, ts: float, ttft: float, e2e: float, output: int, prefill_model: float, decode_model: float,
            handoff_bytes: int, handoff_s: float, outcome: RequestOutcome = RequestOutcome.OK) -> RequestRecord:
    return RequestRecord(rid, ts, 0.0, ttft, handoff_bytes, handoff_s, ttft, e2e - ttft, e2e, 20, output,
                         "prefill-0", "decode-0", outcome, prefill_model, decode_model)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.db"
    d, p = WorkerRole.DECODE, WorkerRole.PREFILL
    with MetricsWriter(path, WriterConfig(retention=None)) as writer:
        writer.add(WorkerRecord("prefill-0", p, "cpu:0", 11, WorkerState.RUNNING, 9000.0))
        writer.add(WorkerRecord("decode-0", d, "cpu:1", 12, WorkerState.RUNNING, 9000.0))
        writer.add(WorkerRecord("decode-1", d, "cpu:2", 13, WorkerState.RUNNING, 9970.0))
        writer.add(WorkerRecord("decode-2", d, "cpu:3", None, WorkerState.STOPPED, 8000.0, 9000.0))  # gone
        writer.add_all([sample(9976.0, "prefill-0", p, 0.5, 1000, mfu=0.4, mbu=0.1),
                        sample(9977.0, "prefill-0", p, 0.5, 1000, mfu=0.4, mbu=0.1),
                        sample(10_001.0, "prefill-0", p, 1.0, 3000, mfu=0.8, mbu=0.2),
                        sample(NOW, "prefill-0", p, 1.0, 9999)])  # at `now`: not in [.., now)
        writer.add(sample(9974.5, "decode-0", d, 1.0, 9999))  # inside the window, before the first bucket
        writer.add_all(sample(9975.0 + s, "decode-0", d, 0.2, 100, mbu=0.3) for s in range(5))
        writer.add(sample(9980.0, "decode-0", d, 0.6, 2000, interval=10.0, mbu=0.5))  # a downsampled 10 s row
        writer.add_all(sample(9982.0 + s, "decode-1", d, 1.0, 300, mbu=0.9) for s in range(2))
        writer.add_all([
            request("r1", 9980.0, ttft=0.1, e2e=1.0, output=10, prefill_model=0.1, decode_model=0.3,
                    handoff_bytes=3000, handoff_s=0.01),
            request("r2", 9990.0, ttft=0.3, e2e=2.0, output=18, prefill_model=0.2, decode_model=0.4,
                    handoff_bytes=6000, handoff_s=0.02),
            request("r3", 9995.0, ttft=0.0, e2e=0.5, output=0, prefill_model=0.1, decode_model=0.0,
                    handoff_bytes=0, handoff_s=0.0, outcome=RequestOutcome.ERROR),
            request("r0", 9000.0, ttft=9.0, e2e=9.0, output=2, prefill_model=9.0, decode_model=9.0,
                    handoff_bytes=10**9, handoff_s=9.0),  # long before the window
        ])
        writer.add_all([EventRecord(9000.0, EventKind.START, "decode-0", {"device": "cpu:1"}),
                        EventRecord(9985.0, EventKind.DRAIN, "decode-0", {"sessions_finished": 2}),
                        EventRecord(9990.0, EventKind.RESUME, "decode-0", {}),
                        EventRecord(10_002.0, EventKind.STOP, "decode-1", {"force": True})])
    return path


def test_bucket_starts_are_aligned_and_end_with_the_bucket_holding_now() -> None:
    starts = bucket_starts(300.0, 5.0, now=1003.7)
    assert len(starts) == 60 and starts[0] == 705.0 and starts[-1] == 1000.0
    assert bucket_starts(10.0, 3.0, now=100.0) == [90.0, 93.0, 96.0, 99.0]  # ceil(10 / 3) buckets
    for window, bucket in ((0.0, 1.0), (10.0, 0.0), (-5.0, 1.0), (float("nan"), 1.0), (10.0, float("inf"))):
        with pytest.raises(UserError, match="positive"):
            bucket_starts(window, bucket, now=100.0)
    with pytest.raises(UserError, match=f"at most {MAX_BUCKETS}"):
        bucket_starts(7 * 86400.0, 1.0, now=100.0)


def test_series_per_worker_and_pool(store: Path) -> None:
    db = open_db(store)
    result = history(db, WINDOW, BUCKET, now=NOW)
    db.close()
    assert (result["now"], result["window_s"], result["bucket_s"]) == (NOW, WINDOW, BUCKET)
    assert set(result["workers"]) == {"prefill-0", "decode-0", "decode-1"}  # decode-2 stopped before the window
    assert set(result["pools"]) == {"prefill", "decode"}  # no mixed worker: no mixed pool
    starts = [9975.0, 9980.0, 9985.0, 9990.0, 9995.0, 10_000.0]
    for series in (*result["workers"].values(), *result["pools"].values()):
        assert [point["ts"] for point in series] == starts  # every bucket, each series
    prefill = result["workers"]["prefill-0"]
    assert prefill[0] == {"ts": 9975.0, "busy": 0.5, "mfu": 0.4, "mbu": 0.1, "tokens_per_s": 1000.0}
    assert [p["busy"] for p in prefill[1:5]] == [0.0] * 4 and prefill[1] == {"ts": 9980.0, **ZERO}
    assert prefill[5] == {"ts": 10_000.0, "busy": 1.0, "mfu": 0.8, "mbu": 0.2, "tokens_per_s": 3000.0}
    assert result["pools"]["prefill"] == prefill  # one worker: its pool is the same series

    d0 = result["workers"]["decode-0"]
    assert d0[0] == pytest.approx({"ts": 9975.0, "busy": 0.2, "mfu": 0.0, "mbu": 0.3, "tokens_per_s": 100.0})
    assert d0[1] == pytest.approx({"ts": 9980.0, "busy": 0.6, "mfu": 0.0, "mbu": 0.5, "tokens_per_s": 200.0})
    decode = result["pools"]["decode"]
    # bucket 9980: decode-0's 10 s row and decode-1's two 1 s rows, weighted by the seconds they cover
    assert decode[1] == pytest.approx({"ts": 9980.0, "busy": (0.6 * 10 + 1.0 * 2) / 12, "mfu": 0.0,
                                       "mbu": (0.5 * 10 + 0.9 * 2) / 12, "tokens_per_s": 2000 / 10 + 600 / 2})
    assert decode[0] == pytest.approx(d0[0]) and decode[2:] == [{"ts": ts, **ZERO} for ts in starts[2:]]


def test_traffic_and_events_of_the_window(store: Path) -> None:
    db = open_db(store)
    result = history(db, WINDOW, BUCKET, now=NOW)
    db.close()
    traffic = result["traffic"]
    assert traffic["requests"] == 3 and traffic["requests_per_s"] == pytest.approx(3 / WINDOW)
    assert traffic["ttft_s"] == pytest.approx({"p50": 0.2, "p99": 0.1 + 0.2 * 0.99})  # successful requests only
    assert traffic["tpot_s"] == pytest.approx({"p50": 0.1, "p99": 0.1})
    assert traffic["prefill_share"] == pytest.approx(0.4 / 1.1) and traffic["decode_share"] == pytest.approx(0.7 / 1.1)
    assert traffic["handoff_bytes_per_s"] == pytest.approx(9000 / WINDOW)
    assert traffic["handoff_share_of_e2e"] == pytest.approx(0.03 / 3.5)
    assert result["events"] == [
        {"ts": 9985.0, "kind": "drain", "worker": "decode-0", "details": {"sessions_finished": 2}},
        {"ts": 9990.0, "kind": "resume", "worker": "decode-0", "details": {}},
        {"ts": 10_002.0, "kind": "stop", "worker": "decode-1", "details": {"force": True}},
    ]


def test_latency_percentiles_per_bucket_of_arrival(store: Path) -> None:
    db = open_db(store)
    latency = history(db, WINDOW, BUCKET, now=NOW)["latency"]
    db.close()
    assert [point["ts"] for point in latency] == [9975.0, 9980.0, 9985.0, 9990.0, 9995.0, 10_000.0]
    empty = {"ttft_p50": None, "ttft_p99": None, "tpot_p50": None, "tpot_p99": None}
    assert latency[1] == pytest.approx({"ts": 9980.0, "ttft_p50": 0.1, "ttft_p99": 0.1, "tpot_p50": 0.1,
                                        "tpot_p99": 0.1})  # r1: 0.9 s over 9 tokens after its first
    assert latency[3] == pytest.approx({"ts": 9990.0, "ttft_p50": 0.3, "ttft_p99": 0.3, "tpot_p50": 0.1,
                                        "tpot_p99": 0.1})  # r2: 1.7 s over 17
    assert latency[4] == {"ts": 9995.0, **empty}  # r3 failed: not a latency
    assert latency[0] == {"ts": 9975.0, **empty} and latency[2] == {"ts": 9985.0, **empty}


def test_at_most_fifty_events_newest_last(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    with MetricsWriter(path, WriterConfig(retention=None)) as writer:
        writer.add_all(EventRecord(NOW - 29 + i * 0.25, EventKind.START, f"decode-{i}", {}) for i in range(80))
    db = open_db(path)
    events = history(db, WINDOW, BUCKET, now=NOW)["events"]
    db.close()
    assert [e["worker"] for e in events] == [f"decode-{i}" for i in range(30, 80)]


def test_an_empty_window_has_zeros_and_null_percentiles(store: Path, tmp_path: Path) -> None:
    db = open_db(store)
    later = history(db, WINDOW, BUCKET, now=NOW + 3600)
    db.close()
    assert set(later["workers"]) == {"prefill-0", "decode-0", "decode-1"}  # still running, idle
    assert all(point == {"ts": point["ts"], **ZERO} for series in later["workers"].values() for point in series)
    assert later["traffic"] == {"requests": 0, "requests_per_s": 0.0, "ttft_s": {"p50": None, "p99": None},
                                "tpot_s": {"p50": None, "p99": None}, "prefill_share": 0.0, "decode_share": 0.0,
                                "handoff_bytes_per_s": 0.0, "handoff_share_of_e2e": 0.0}
    assert later["events"] == []
    fresh = open_db(tmp_path / "fresh.db")
    assert history(fresh, 60.0, 10.0)["pools"] == {} and history(fresh, 60.0, 10.0)["workers"] == {}
    fresh.close()


def test_a_colocated_fleet_has_a_mixed_pool_only(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    m = WorkerRole.MIXED
    with MetricsWriter(path, WriterConfig(retention=None)) as writer:
        writer.add_all([WorkerRecord("mixed-0", m, "cpu:0", 1, WorkerState.RUNNING, 0.0),
                        WorkerRecord("mixed-1", m, "cpu:1", 2, WorkerState.RUNNING, 0.0)])
        writer.add_all([sample(NOW - 2, "mixed-0", m, 0.4, 50), sample(NOW - 2, "mixed-1", m, 0.8, 70)])
    db = open_db(path)
    result = history(db, WINDOW, BUCKET, now=NOW)
    db.close()
    assert set(result["pools"]) == {"mixed"}
    assert result["pools"]["mixed"][-1] == pytest.approx({"ts": 10_000.0, "busy": 0.6, "mfu": 0.0, "mbu": 0.0,
                                                          "tokens_per_s": 120.0})
