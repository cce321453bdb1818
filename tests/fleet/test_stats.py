"""The controller's live utilization window: steps count for their part inside the window, so busy,
MFU and MBU stay within [0, 1] for any honest step reports; the window's memory stays bounded. And what it counts
per worker and pool: prefix hits, KV tier reads, speculative drafts, structured-output requests."""

from dataclasses import replace

import pytest

from fleetctl.domain import Phase, WorkerRole, WorkerState
from fleetctl.engine.core.kv_tiers.file_tier import TierStats
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.fleet.request import TrackedRequest
from fleetctl.engine.fleet.stats import BUSY_WINDOW_S, FleetStats
from fleetctl.engine.fleet.worker_view import WorkerView
from fleetctl.engine.worker.protocol import StepReport

PEAK_FLOPS, PEAK_BYTES = 1e12, 1e10


def view() -> WorkerView:
    return WorkerView("prefill-0", WorkerRole.PREFILL, "cpu:0", WorkerState.RUNNING, peak_flops=PEAK_FLOPS,
                      peak_bytes_per_s=PEAK_BYTES)


def report(ended_at: float, seconds: float, flops: float, nbytes: float, num_tokens: int = 1) -> StepReport:
    return StepReport(worker_id="prefill-0", phase=Phase.PREFILL, tokens=[], seq_tokens=[], num_seqs=1,
                      num_tokens=num_tokens, context_tokens=1, seconds=seconds, flops=int(flops), bytes=int(nbytes),
                      free_blocks=0, running=0, waiting=0, ended_at=ended_at)


def test_a_step_longer_than_the_window_counts_only_its_part_inside() -> None:
    stats = FleetStats()
    # a 12 s prefill running at 90 % of the FLOP peak and 50 % of the bandwidth peak
    stats.on_step(view(), report(1000.0, 12.0, 0.9 * PEAK_FLOPS * 12, 0.5 * PEAK_BYTES * 12, num_tokens=6000))
    util = stats.utilization("prefill-0", now=1001.0)  # the window [996, 1001] holds 4 s of it
    assert util.busy == pytest.approx(4 / BUSY_WINDOW_S)
    assert util.tokens_per_s == pytest.approx(6000 * 4 / 12 / BUSY_WINDOW_S)  # its tokens, in the same share
    assert util.mfu == pytest.approx(0.9 * 4 / BUSY_WINDOW_S)
    assert util.mbu == pytest.approx(0.5 * 4 / BUSY_WINDOW_S)
    saturated = stats.utilization("prefill-0", now=1000.0)
    assert saturated.busy == pytest.approx(1.0) and saturated.mfu == pytest.approx(0.9)


def test_back_to_back_steps_fill_the_window_exactly() -> None:
    stats = FleetStats()
    for i in range(100):
        stats.on_step(view(), report(1000.0 + 0.1 * (i + 1), 0.1, 0.5 * PEAK_FLOPS * 0.1, 0.8 * PEAK_BYTES * 0.1,
                                     num_tokens=8))
    util = stats.utilization("prefill-0", now=1010.0)
    assert util.busy == pytest.approx(1.0) and util.mfu == pytest.approx(0.5) and util.mbu == pytest.approx(0.8)
    assert util.tokens_per_s == pytest.approx(8 / 0.1)  # eight tokens every 0.1 s


def test_the_window_forgets_old_steps_without_being_read() -> None:
    stats = FleetStats()
    for i in range(10_000):
        stats.on_step(view(), report(float(i), 0.001, 1, 1))
    assert len(stats._steps["prefill-0"]) <= BUSY_WINDOW_S + 1
    assert stats.utilization("prefill-0", now=20_000.0).busy == 0.0


def test_prefix_cache_hit_ratio_per_worker_and_pool_counts_prefill_tokens() -> None:
    stats = FleetStats()
    decode = WorkerView("decode-0", WorkerRole.DECODE, "cpu:1", WorkerState.RUNNING)
    prefill = StepReport(worker_id="prefill-0", phase=Phase.PREFILL, tokens=[], seq_tokens=[100, 40], num_seqs=2,
                         num_tokens=140, context_tokens=1000, seconds=0.1, flops=1, bytes=1, free_blocks=0, running=0,
                         waiting=0, ended_at=1000.0, cached_tokens={"b": 860})
    local = StepReport(worker_id="decode-0", phase=Phase.PREFILL, tokens=[], seq_tokens=[20], num_seqs=1,
                       num_tokens=20, context_tokens=500, seconds=0.1, flops=1, bytes=1, free_blocks=0, running=0,
                       waiting=0, ended_at=1000.0, cached_tokens={"c": 480})
    stats.on_step(view(), prefill)
    stats.on_step(decode, local)
    stats.on_step(decode, StepReport(worker_id="decode-0", phase=Phase.DECODE, tokens=[], seq_tokens=[1, 1],
                                     num_seqs=2, num_tokens=2, context_tokens=900, seconds=0.01, flops=1, bytes=1,
                                     free_blocks=0, running=2, waiting=0, ended_at=1000.1))  # decode: no prefill
    assert stats.hit_ratio_of(["prefill-0"]) == pytest.approx(860 / 1000)
    assert stats.hit_ratio_of(["decode-0"]) == pytest.approx(480 / 500)
    assert stats.hit_ratio_of(["prefill-0", "decode-0"]) == pytest.approx(1340 / 1500)
    assert stats.hit_ratio_of(["mixed-0"]) == 0.0
    stats.refresh_gauges([view(), decode])
    assert stats.registry.get_sample_value("fleet_pool_prefix_cache_hit_ratio", {"role": "decode"}) == 0.96
    assert stats.registry.get_sample_value("fleet_prefill_cached_tokens_total",
                                           {"worker": "prefill-0", "role": "prefill"}) == 860


def test_tier_io_counts_what_grew_per_process_and_the_tiers_occupancy() -> None:
    """A process's running totals: a second report adds only its growth; the same process under a switched id
    adds nothing twice; a restarted process (a new pid) starts from zero."""
    stats = FleetStats()
    worker = view()
    worker.pid = 100

    def io(read: int, written: int, read_s: float, used: int) -> dict[str, TierStats]:
        return {"host": TierStats(bytes_read=read, bytes_written=written, read_s=read_s, write_s=read_s / 2,
                                  used_bytes=used, capacity_bytes=1000)}

    def sample(name: str, **labels: str) -> float | None:
        return stats.registry.get_sample_value(name, labels)

    stats.on_step(worker, replace(report(1.0, 0.1, 1, 1), tier_io=io(300, 50, 0.1, 400)))
    stats.on_step(worker, replace(report(2.0, 0.1, 1, 1), tier_io=io(500, 50, 0.2, 450)))
    assert sample("fleet_kv_tier_read_bytes_total", tier="host", worker="prefill-0") == 500
    assert sample("fleet_kv_tier_written_bytes_total", tier="host", worker="prefill-0") == 50
    assert sample("fleet_kv_tier_read_seconds_total", tier="host", worker="prefill-0") == pytest.approx(0.2)
    assert (sample("fleet_kv_tier_used_bytes", tier="host"), sample("fleet_kv_tier_capacity_bytes", tier="host")) == (
        450, 1000)
    worker.worker_id = "decode-1"  # switched: the same process under a new id
    stats.on_step(worker, replace(report(3.0, 0.1, 1, 1), tier_io=io(600, 50, 0.25, 450)))
    assert sample("fleet_kv_tier_read_bytes_total", tier="host", worker="decode-1") == 100
    worker.pid = 101  # restarted
    stats.on_step(worker, replace(report(4.0, 0.1, 1, 1), tier_io=io(70, 0, 0.01, 460)))
    assert sample("fleet_kv_tier_read_bytes_total", tier="host", worker="decode-1") == 170


def test_a_tiers_occupancy_is_its_freshest_measurement_whichever_process_reports_last() -> None:
    """A worker that only reads a tier last measured it when it opened it: its report must not hide what a
    writer measured since."""
    stats, reader, writer = FleetStats(), view(), view()
    reader.pid, writer.pid = 100, 101

    def io(used: int, at: float) -> dict[str, TierStats]:
        return {"host": TierStats(used_bytes=used, used_at=at, capacity_bytes=1000)}

    stats.on_step(writer, replace(report(1.0, 0.1, 1, 1), tier_io=io(640, at=20.0)))
    stats.on_step(reader, replace(report(2.0, 0.1, 1, 1), tier_io=io(0, at=10.0)))
    assert stats.registry.get_sample_value("fleet_kv_tier_used_bytes", {"tier": "host"}) == 640
    stats.on_step(reader, replace(report(3.0, 0.1, 1, 1), tier_io=io(320, at=30.0)))
    assert stats.registry.get_sample_value("fleet_kv_tier_used_bytes", {"tier": "host"}) == 320


def test_speculative_decoding_counts_per_worker_and_pool() -> None:
    stats = FleetStats()
    decode = [WorkerView(f"decode-{i}", WorkerRole.DECODE, f"cpu:{i}", WorkerState.RUNNING) for i in range(2)]
    for worker, drafted, accepted, verifications in ((decode[0], 12, 9, 3), (decode[0], 4, 1, 2), (decode[1], 8, 8, 1)):
        stats.on_step(worker, replace(report(1000.0, 0.01, 1, 1), worker_id=worker.worker_id, phase=Phase.DECODE,
                                      drafted=drafted, accepted=accepted, verifications=verifications))
    stats.on_step(decode[1], replace(report(1000.0, 0.01, 1, 1), worker_id="decode-1", phase=Phase.DECODE))
    assert (stats.drafts_of(["decode-0"]).acceptance, stats.drafts_of(["decode-0"]).tokens_per_step) == (0.625, 3.0)
    pool = stats.drafts_of(["decode-0", "decode-1"])
    assert (pool.acceptance, pool.tokens_per_step) == (round(18 / 24, 4), 4.0)
    assert stats.drafts_of(["prefill-0"]).acceptance is None is stats.drafts_of(["prefill-0"]).tokens_per_step
    assert stats.registry.get_sample_value("vllm:spec_decode_num_draft_tokens_total",
                                           {"worker": "decode-0", "role": "decode"}) == 16
    assert stats.registry.get_sample_value("vllm:spec_decode_num_drafts_total",
                                           {"worker": "decode-1", "role": "decode"}) == 1


def test_structured_requests_count_per_worker_they_ran_on_and_per_pool() -> None:
    stats = FleetStats()
    ran = [("json_schema:person", "prefill-0", "decode-0"), ("tools:required", "prefill-0", "decode-1"),
           ("json_schema:city", None, "decode-0"), ("", "prefill-0", "decode-0")]  # a local prefill; no grammar
    for constraint, prefill, decode in ran:
        params = SamplingParams(grammar="start: /x/" if constraint else None, constraint=constraint)
        req = TrackedRequest("r", [1], params, seed=1, stream=None)  # type: ignore[arg-type]
        req.prefill_worker, req.decode_worker = prefill, decode
        stats.on_request_done(req)
    assert stats.structured_of(["prefill-0"]) == {"json_schema": 1, "tools": 1}
    assert stats.structured_of(["decode-0", "decode-1"]) == {"json_schema": 2, "tools": 1}
    assert stats.structured_of(["decode-9"]) == {}
    assert stats.registry.get_sample_value("fleet_structured_output_requests_total", {"kind": "json_schema"}) == 2
