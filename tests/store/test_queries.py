"""Read side: utilization per worker and pool, latency percentiles, handoff totals, classify, the dashboard."""

from dataclasses import replace

import pytest

from fleetctl.domain import RequestOutcome, WorkerRole, WorkerState
from fleetctl.store.classify import bucket_labels, classify
from fleetctl.store.db import open_db
from fleetctl.store.queries import (
    dashboard,
    handoff_totals,
    percentiles,
    pool_utilization,
    request_latency,
    worker_utilization,
)
from fleetctl.store.records import RequestRecord, WorkerRecord, WorkerSample
from fleetctl.store.writer import MetricsWriter, WriterConfig

NOW = 10_000.0
CONFIG = WriterConfig(retention=None)


def sample(ts: float, wid: str, role: WorkerRole, *, busy: float, mfu: float, mbu: float, tokens: int,
           queue: float = 0.0, steps: int = 10, batch: float = 4.0, interval: float = 1.0) -> WorkerSample:
    prefill = tokens if role is WorkerRole.PREFILL else 0
    return WorkerSample(ts, wid, role, interval, busy, steps, prefill, tokens - prefill, 10**9, 10**8, mfu, mbu,
                        batch, 0.5, queue)


def request(rid: str, prompt: int, output: int, *, ts: float = NOW - 30, ttft: float = 0.1, e2e: float = 1.0,
            prefill_model: float = 0.1, decode_model: float = 0.1,
            outcome: RequestOutcome = RequestOutcome.OK) -> RequestRecord:
    return RequestRecord(rid, ts, 0.0, ttft, 0, 0.0, ttft, e2e - ttft, e2e, prompt, output, "prefill-0", "decode-0",
                         outcome, prefill_model, decode_model)


@pytest.fixture
def fleet(tmp_path):
    """Two decode workers and a prefill worker over the last 60 s; decode-1 stopped long ago."""
    path = tmp_path / "fleet.db"
    with MetricsWriter(path, CONFIG) as writer:
        writer.add(WorkerRecord("prefill-0", WorkerRole.PREFILL, "cuda:0", 11, WorkerState.RUNNING, 0.0))
        writer.add(WorkerRecord("decode-0", WorkerRole.DECODE, "cuda:1", 12, WorkerState.RUNNING, 0.0))
        writer.add(WorkerRecord("decode-1", WorkerRole.DECODE, "cuda:2", 13, WorkerState.RUNNING, 0.0))
        writer.add(WorkerRecord("decode-2", WorkerRole.DECODE, "cuda:3", None, WorkerState.STOPPED, 0.0, 100.0))
        for s in range(60):
            ts = NOW - 60 + s
            writer.add(sample(ts, "prefill-0", WorkerRole.PREFILL, busy=0.9, mfu=0.6, mbu=0.1, tokens=4000, queue=2))
            writer.add(sample(ts, "decode-0", WorkerRole.DECODE, busy=0.5, mfu=0.05, mbu=0.7, tokens=100))
        for s in range(30):  # decode-1 started half-way through the window
            writer.add(sample(NOW - 30 + s, "decode-1", WorkerRole.DECODE, busy=1.0, mfu=0.1, mbu=0.9, tokens=300,
                              steps=30, batch=8.0))
        writer.add(sample(NOW - 600, "decode-0", WorkerRole.DECODE, busy=0.0, mfu=0.0, mbu=0.0, tokens=0))
    return open_db(path)


def test_worker_utilization_is_per_covered_second(fleet):
    by_id = {w.worker_id: w for w in worker_utilization(fleet, 60, now=NOW)}
    assert set(by_id) == {"prefill-0", "decode-0", "decode-1"}
    d1 = by_id["decode-1"].window
    assert d1.seconds == 30 and d1.busy == 1.0 and d1.decode_tokens_per_s == 300  # not diluted by the window
    p = by_id["prefill-0"].window
    assert (p.busy, p.mfu, p.mbu, p.prefill_tokens_per_s, p.queue) == pytest.approx((0.9, 0.6, 0.1, 4000, 2))


def test_pool_utilization_weights_fractions_and_adds_rates(fleet):
    pools = pool_utilization(fleet, 60, now=NOW)
    decode = pools[WorkerRole.DECODE]
    assert decode.workers == 2
    assert decode.window.busy == pytest.approx((0.5 * 60 + 1.0 * 30) / 90)
    assert decode.window.mbu == pytest.approx((0.7 * 60 + 0.9 * 30) / 90)
    assert decode.window.decode_tokens_per_s == pytest.approx(100 + 300)
    assert decode.window.batch_size == pytest.approx((4 * 600 + 8 * 900) / 1500)  # weighted by steps
    assert pools[WorkerRole.PREFILL].as_json() == pytest.approx(
        {"workers": 1, "busy": 0.9, "mfu": 0.6, "mbu": 0.1, "queue": 2.0})
    assert WorkerRole.MIXED not in pools


def test_dashboard_has_latest_rows_windows_and_pools(fleet):
    dash = dashboard(fleet, window_s=60, now=NOW)
    assert [w.id for w in dash.workers] == ["decode-0", "decode-1", "prefill-0"]  # decode-2 stopped long ago
    views = {w.id: w for w in dash.workers}
    assert views["decode-1"].latest is not None and views["decode-1"].latest.ts == NOW - 1
    assert views["decode-0"].latest.role is WorkerRole.DECODE
    assert views["prefill-0"].state is WorkerState.RUNNING and views["prefill-0"].pid == 11
    assert dash.pools[WorkerRole.DECODE].workers == 2
    empty = dashboard(fleet, window_s=10, now=NOW + 3600)
    assert all(w.latest is None and w.window is None for w in empty.workers)
    assert empty.pools == {}


def test_percentiles_interpolate_like_numpy():
    p = percentiles([float(v) for v in range(1, 101)])
    assert (p.p50, p.p90, p.p99) == pytest.approx((50.5, 90.1, 99.01))
    assert percentiles([]).p50 is None


def test_request_latency_over_the_window(tmp_path):
    path = tmp_path / "fleet.db"
    with MetricsWriter(path, CONFIG) as writer:
        writer.add(request("a", 10, 11, ttft=0.2, e2e=1.2))  # TPOT 0.1
        writer.add(request("b", 10, 21, ttft=0.4, e2e=2.4))  # TPOT 0.1
        writer.add(request("c", 10, 1, ttft=0.3, e2e=0.3))  # one token: no TPOT
        writer.add(request("d", 10, 11, outcome=RequestOutcome.ERROR, ttft=9.0, e2e=9.0))
        writer.add(request("e", 10, 11, ts=NOW - 3600, ttft=9.0, e2e=9.0))  # outside the window
    stats = request_latency(open_db(path), 60, now=NOW)
    assert stats.requests == 3
    assert stats.ttft.p50 == pytest.approx(0.3)
    assert (stats.tpot.p50, stats.tpot.p99) == pytest.approx((0.1, 0.1))
    assert stats.e2e.p90 == pytest.approx(1.2 + 0.8 * 1.2)


def test_handoff_totals_count_every_outcome_and_share_only_finished_requests(tmp_path):
    db = write_requests(tmp_path, "handoff.db", [
        replace(request("a", 10, 11, e2e=2.0), handoff_bytes=1000, handoff_s=0.01),
        replace(request("b", 10, 11, e2e=3.0), handoff_bytes=3000, handoff_s=0.02),
        replace(request("c", 10, 11, outcome=RequestOutcome.CANCELLED, e2e=0.5), handoff_bytes=500, handoff_s=0.4),
        request("d", 10, 1, e2e=1.0),  # one token: never handed off
        replace(request("e", 10, 11, ts=NOW - 3600), handoff_bytes=9, handoff_s=9.0),  # outside the window
    ])
    totals = handoff_totals(db, 60, now=NOW)
    assert (totals.count, totals.bytes) == (3, 4500)
    assert totals.seconds == pytest.approx(0.43)
    assert totals.share_of_e2e == pytest.approx(0.03 / 6.0)
    assert handoff_totals(db, 60, now=NOW + 3600).share_of_e2e == 0.0


def write_requests(tmp_path, name: str, requests: list[RequestRecord]):
    path = tmp_path / name
    with MetricsWriter(path, CONFIG) as writer:
        assert writer.add_all(requests) == len(requests)
    return open_db(path)


def test_classify_shape_and_shares(tmp_path):
    # RAG-like: long prompts, short answers, prefill-heavy
    prompt_heavy = [request(f"p{i}", 3000, 20, prefill_model=0.8, decode_model=0.1) for i in range(10)]
    # chat-like: short prompts, long answers, decode-heavy
    output_heavy = [request(f"o{i}", 60, 900, prefill_model=0.02, decode_model=0.9) for i in range(10)]
    rag = classify(write_requests(tmp_path, "rag.db", prompt_heavy), 60, now=NOW)
    chat = classify(write_requests(tmp_path, "chat.db", output_heavy), 60, now=NOW)
    mixed = classify(write_requests(tmp_path, "mix.db", prompt_heavy + output_heavy), 60, now=NOW)

    for result in (rag, chat, mixed):
        assert result.prefill_share + result.decode_share == pytest.approx(1.0)
    assert rag.prefill_share > 0.8 and chat.prefill_share < 0.05
    assert chat.prefill_share < mixed.prefill_share < rag.prefill_share

    body = mixed.as_json()
    assert list(body) == ["window_s", "requests", "prefill_share", "decode_share", "prefill_model_s",
                          "decode_model_s", "buckets", "prefill_cached_tokens", "prefill_computed_tokens",
                          "prefix_hit_ratio", "local_prefills", "tier_tokens"]
    assert body["tier_tokens"] == {}  # no tier served any
    assert body["requests"] == 20
    assert (body["prefill_model_s"], body["decode_model_s"]) == pytest.approx((10 * 0.82, 10 * 1.0))
    assert body["buckets"] == [
        {"prompt_tokens": "0-128", "output_tokens": "512-2048", "requests": 10,
         "prefill_share": pytest.approx(0.02 / 0.92)},
        {"prompt_tokens": "2048+", "output_tokens": "0-128", "requests": 10, "prefill_share": pytest.approx(0.8 / 0.9)},
    ]


def test_classify_counts_cached_and_computed_prompt_tokens_and_local_prefills(tmp_path):
    turns = [replace(request(f"t{i}", 1000, 50, prefill_model=0.01, decode_model=0.5), prefill_cached_tokens=960,
                     prefill_computed_tokens=40, local_prefill=int(i > 0), host_tier_tokens=160 * (i % 2),
                     disk_tier_tokens=32 * (i == 3)) for i in range(4)]
    first = replace(request("first", 1000, 50, prefill_model=0.25, decode_model=0.5), prefill_computed_tokens=1000)
    result = classify(write_requests(tmp_path, "agent.db", [first, *turns]), 60, now=NOW)
    assert (result.prefill_cached_tokens, result.prefill_computed_tokens, result.local_prefills) == (3840, 1160, 3)
    assert result.prefix_hit_ratio == pytest.approx(3840 / 5000)
    assert result.tier_tokens == {"host": 320, "disk": 32}  # of the cached, what the KV tiers read back
    assert result.decode_share == pytest.approx(2.5 / 2.79)  # cached tokens took no model time


def test_classify_bucket_edges_and_empty_window(tmp_path):
    assert bucket_labels() == ["0-128", "128-512", "512-2048", "2048+"]
    db = write_requests(tmp_path, "edges.db", [request("a", 127, 128), request("b", 128, 2048)])
    labels = [(b.prompt_tokens, b.output_tokens) for b in classify(db, 60, now=NOW).buckets]
    assert labels == [("0-128", "128-512"), ("128-512", "2048+")]
    empty = classify(db, 60, now=NOW + 3600)
    assert (empty.requests, empty.prefill_share, empty.decode_share, empty.buckets) == (0, 0.0, 0.0, [])
