"""What `plan` reads from the store, on rows written by hand: prefill steps rebuilt from the requests they
computed, a request's decode with the prefill steps that stalled it on a mixed worker taken out, the batch from
the worker's rows, the context from its neighbours, the peaks the samples imply, and the layout."""

import pytest

from fleetctl.domain import DeviceKind, RequestOutcome, WorkerRole, WorkerState
from fleetctl.store.db import open_db
from fleetctl.store.plan_inputs import plan_inputs
from fleetctl.store.records import RequestRecord, WorkerRecord, WorkerSample
from fleetctl.store.writer import MetricsWriter, WriterConfig

T = 50_000.0


def request(rid: str, ts: float, queue_s: float, prefill_s: float, e2e_s: float, prompt: int, output: int,
            worker: str = "mixed-0") -> RequestRecord:
    ttft = queue_s + prefill_s
    return RequestRecord(rid, ts, queue_s, prefill_s, 0, 0.0, ttft, e2e_s - ttft, e2e_s, prompt, output, worker,
                         None, RequestOutcome.OK, prefill_s, 0.0)


def sample(ts: float, steps: int, batch: float) -> WorkerSample:
    return WorkerSample(ts, "mixed-0", WorkerRole.MIXED, 1.0, 0.5, steps, 0, steps, 2 * 10**9, 10**9, 0.2, 0.5, batch,
                        0.1, 0.0)


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "fleet.db"
    with MetricsWriter(path, WriterConfig(retention=None)) as writer:
        writer.add(WorkerRecord("mixed-0", WorkerRole.MIXED, "cpu:0", 1, WorkerState.RUNNING, T - 10))
        writer.add(WorkerRecord("mixed-9", WorkerRole.MIXED, "cpu:1", 2, WorkerState.STOPPED, T - 100, T - 50))
        # a decodes 10 tokens from T+1 to T+3, b 5 tokens from T+2 to T+3.5; b's prefill (T+1.5 to T+2) stalls a
        writer.add(request("a", T, 0.0, 1.0, 3.0, 100, 11))
        writer.add(request("b", T + 1.2, 0.3, 0.5, 2.3, 300, 6))
        writer.add(request("c", T + 5, 0.0, 0.4, 0.4, 200, 1))
        writer.add(request("d", T + 5, 0.0, 0.4, 0.4, 100, 1))
        writer.add_all([sample(T + s, 4, 1.5) for s in range(0, 6)])
    return open_db(path)


def test_prefill_steps_are_rebuilt_from_their_requests(db) -> None:
    steps = sorted(plan_inputs(db, 60, now=T + 30).prefill_steps, key=lambda s: (s.tokens, s.seconds))
    assert [(s.tokens, s.squares, s.seconds) for s in steps] == [(100, 100**2, 1.0), (300, 200**2 + 100**2, 0.4),
                                                                 (300, 300**2, 0.5)]  # c and d shared a step
    assert {s.kind for s in steps} == {DeviceKind.CPU}


def test_a_decode_leaves_out_the_prefill_that_stalled_it(db) -> None:
    inputs = plan_inputs(db, 60, now=T + 30)
    runs = {r.steps: r for r in inputs.decode_runs}
    a, b = runs[10], runs[5]
    assert a.seconds_per_step == pytest.approx((2.0 - 0.5) / 10)  # T+1 .. T+3, less b's prefill
    assert b.seconds_per_step == pytest.approx(1.5 / 5)  # nothing stalled it
    assert a.batch == pytest.approx(1.5)
    # per sequence over a's decode: a for 2 s at a mean 106 tokens, b for 1 s at a mean 301 + 5 · 0.5 / 1.5
    assert a.context == pytest.approx(a.batch * (2 * 106 + 1 * (301 + 5 * 0.5 / 1.5)) / 3)


def test_peaks_requests_and_the_layout(db) -> None:
    inputs = plan_inputs(db, 60, now=T + 30)
    assert inputs.peaks[DeviceKind.CPU].peak_flops == pytest.approx(2 * 10**9 / 0.2)
    assert inputs.peaks[DeviceKind.CPU].peak_bytes_per_s == pytest.approx(10**9 / 0.5)
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in inputs.requests] == [
        (0.0, 100, 11), (pytest.approx(1.2), 300, 6), (5.0, 200, 1), (5.0, 100, 1)]
    assert [w.worker_id for w in inputs.workers] == ["mixed-0"]  # mixed-9 had stopped long before
    empty = plan_inputs(db, 60, now=T + 3600)
    assert (empty.requests, empty.prefill_steps, empty.decode_runs, empty.workers) == ([], [], [], [])


def test_the_window_holds_the_requests_that_ended_in_it(db) -> None:
    """A window shorter than the latencies (autoplan's, under load) still holds requests: a and b arrived
    before T+2.5 but ended inside [T+2.5, T+6); c and d arrived and ended inside it."""
    inputs = plan_inputs(db, 3.5, now=T + 6)
    assert [(r.arrival_s, r.prompt_tokens) for r in inputs.requests] == [
        (0.0, 100), (pytest.approx(1.2), 300), (5.0, 200), (5.0, 100)]
    assert [r.prompt_tokens for r in plan_inputs(db, 2.0, now=T + 6).requests] == [200, 100]  # a, b ended before


def test_a_prompt_its_decode_worker_prefilled_is_a_prefill_step_there(tmp_path) -> None:
    """Agent traffic: later turns are prefilled by their decode worker (no prefill worker on the record, no
    handoff); their uncached tokens are that worker's prefill steps, so `plan` has points to fit."""
    path = tmp_path / "fleet.db"
    with MetricsWriter(path, WriterConfig(retention=None)) as writer:
        writer.add(WorkerRecord("decode-0", WorkerRole.DECODE, "cpu:1", 1, WorkerState.RUNNING, T - 10))
        for i, (prompt, cached) in enumerate([(260, 224), (300, 272), (420, 384)]):
            writer.add(RequestRecord(f"t{i}", T + i, 0.05, 0.2 + 0.1 * i, 0, 0.0, 0.3, 1.0, 1.3 + 0.1 * i, prompt, 8,
                                     None, "decode-0", RequestOutcome.OK, 0.2, 0.5, prefill_cached_tokens=cached,
                                     local_prefill=1))
    steps = sorted(plan_inputs(open_db(path), 60, now=T + 30).prefill_steps, key=lambda s: s.tokens)
    assert [(s.kind, s.tokens, s.seconds) for s in steps] == [
        (DeviceKind.CPU, 28, pytest.approx(0.3)), (DeviceKind.CPU, 36, pytest.approx(0.2)),
        (DeviceKind.CPU, 36, pytest.approx(0.4))]
