"""`fleetctl demo`'s summary over a store written by hand: phase windows, shares added up per phase
kind by model seconds (not by averaging shares), pools, latency, handoffs, and the wait for the store."""

import time

import pytest

from fleetctl.console.demo.schedule import DemoPhase, TrafficConfig, phase_shapes
from fleetctl.console.demo.summary import demo_summary, render_summary, wait_for_store
from fleetctl.console.demo.traffic import PhaseLog
from fleetctl.domain import RequestOutcome, WorkerRole, WorkerState
from fleetctl.store.db import open_db
from fleetctl.store.records import RequestRecord, WorkerRecord, WorkerSample
from fleetctl.store.writer import MetricsWriter, WriterConfig

T0 = 1_000_000.0
SHAPES = phase_shapes(TrafficConfig(context_len=512, prompt_workers=1, decode_workers=1))
HEADER = {"model": "tiny", "url": "http://x", "embedded": True, "phase_seconds": 10.0}


def request(rid: str, ts: float, prefill_model: float, decode_model: float, *, handoff_bytes: int = 100,
            outcome: RequestOutcome = RequestOutcome.OK) -> RequestRecord:
    return RequestRecord(rid, ts, 0.0, 0.1, handoff_bytes, 0.01, 0.2, 1.0, 1.2, 100, 11, "prefill-0", "decode-0",
                         outcome, prefill_model, decode_model)


def sample(ts: float, wid: str, role: WorkerRole, busy: float) -> WorkerSample:
    return WorkerSample(ts, wid, role, 1.0, busy, 5, 0, 0, 10**9, 10**8, busy / 10, busy / 5, 2.0, 0.1, 0.0)


@pytest.fixture
def db(tmp_path):
    with MetricsWriter(tmp_path / "fleet.db", WriterConfig(retention=None)) as writer:
        writer.add(WorkerRecord("prefill-0", WorkerRole.PREFILL, "cpu:0", 1, WorkerState.RUNNING, 0.0))
        writer.add(WorkerRecord("decode-0", WorkerRole.DECODE, "cpu:1", 2, WorkerState.RUNNING, 0.0))
        for s in range(30):  # RAG 0-10 s and 20-30 s keep prefill busy, agent 10-20 s decode
            rag = s < 10 or s >= 20
            writer.add(sample(T0 + s, "prefill-0", WorkerRole.PREFILL, 0.8 if rag else 0.2))
            writer.add(sample(T0 + s, "decode-0", WorkerRole.DECODE, 0.1 if rag else 0.9))
        writer.add_all([request("r1", T0 + 1, 0.9, 0.1), request("r2", T0 + 5, 0.7, 0.3)])
        writer.add_all([request("a1", T0 + 12, 0.1, 0.9), request("a2", T0 + 15, 0.1, 1.9, handoff_bytes=0)])
        writer.add(request("r3", T0 + 21, 3.0, 0.0, outcome=RequestOutcome.CANCELLED))
        writer.add(request("late", T0 + 30.5, 5.0, 5.0))  # after the run: in no window
    return open_db(tmp_path / "fleet.db")


def phases() -> list[PhaseLog]:
    kinds = [DemoPhase.RAG, DemoPhase.AGENT, DemoPhase.RAG]
    counts = [(2, 2, 0), (2, 2, 0), (1, 0, 1)]  # (sent, completed, cancelled), as the store's rows say
    return [PhaseLog(i, kind, T0 + 10 * i, T0 + 10 * (i + 1), sent, completed, 0, cancelled)
            for i, (kind, (sent, completed, cancelled)) in enumerate(zip(kinds, counts, strict=True))]


def test_summary_per_phase_and_per_kind(db) -> None:
    s = demo_summary(db, phases(), SHAPES, HEADER, None)
    assert (s["model"], s["duration_s"], s["requests"], s["completed"], s["cancelled"]) == ("tiny", 30.0, 5, 4, 1)
    assert [(p["kind"], p["start_s"], p["end_s"]) for p in s["phases"]] == [
        ("rag", 0.0, 10.0), ("agent", 10.0, 20.0), ("rag", 20.0, 30.0)]
    first, agent = s["phases"][0], s["phases"][1]
    assert (first["prefill_share"], first["decode_share"]) == (0.8, 0.2)
    assert (agent["prefill_share"], agent["decode_share"]) == pytest.approx((0.2 / 3.0, 2.8 / 3.0), abs=1e-4)
    assert first["prompt_tokens"] == [128, 256] and agent["output_tokens"] == [64, 128]
    assert first["pools"]["prefill"]["busy"] == 0.8 and agent["pools"]["decode"]["busy"] == 0.9
    # RAG over both of its phases: (0.9 + 0.7 + 3.0) / 5.0 of model time, not the mean of 0.8 and 1.0
    assert s["by_kind"]["rag"] == {"phases": 2, "requests": 3, "prefill_share": 0.92, "decode_share": 0.08}
    assert s["by_kind"]["agent"]["requests"] == 2
    assert s["pools"]["prefill"] == {"workers": 1, "busy": pytest.approx((20 * 0.8 + 10 * 0.2) / 30),
                                     "mfu": pytest.approx(0.06), "mbu": pytest.approx(0.12)}
    assert s["ttft_s"] == {"p50": 0.2, "p99": 0.2} and s["tpot_s"]["p50"] == pytest.approx(0.1)
    assert s["handoffs"]["count"] == 4 and s["handoffs"]["bytes"] == 400
    assert s["handoffs"]["share_of_e2e"] == pytest.approx(0.04 / 4.8, abs=1e-6)
    lines = render_summary(s)
    assert any(line.startswith("rag    model time: prefill 92.0%") for line in lines)


def test_wait_for_store_returns_once_the_run_is_covered(db) -> None:
    started = time.monotonic()
    assert wait_for_store(db, phases(), timeout=5.0)
    assert time.monotonic() - started < 1.0
    unfinished = phases()
    unfinished[-1].completed = 9  # more than the store will ever hold
    assert not wait_for_store(db, unfinished, timeout=0.3)
