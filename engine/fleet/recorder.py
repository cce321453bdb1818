"""Writes the fleet's life into the SQLite metrics store: worker rows and events, per-second worker
samples (aggregated from step reports), GPU samples (pynvml, where present), finished requests."""

import time

from fleetctl.domain import EventKind, RequestOutcome, WorkerState
from fleetctl.engine.fleet.request import TrackedRequest
from fleetctl.engine.fleet.worker_view import WorkerView
from fleetctl.engine.metrics.gpu_sampler import GpuSampler
from fleetctl.engine.worker.protocol import StepReport
from fleetctl.store.aggregate import StepAggregator, StepRecord
from fleetctl.store.records import EventRecord, RequestRecord, WorkerRecord
from fleetctl.store.writer import MetricsWriter


class FleetRecorder:
    def __init__(self, store_path) -> None:
        self.writer = MetricsWriter(store_path)
        self.aggregator = StepAggregator()
        self.gpus = GpuSampler()
        self._started: dict[str, float] = {}

    def worker_started(self, view: WorkerView) -> None:
        now = time.time()
        self._started[view.worker_id] = now
        self.aggregator.add_worker(view.worker_id, view.role, view.peak_flops, view.peak_bytes_per_s, now)
        self.writer.add(WorkerRecord(view.worker_id, view.role, view.device, view.pid, WorkerState.RUNNING, now))
        self.event(EventKind.START, view.worker_id, {"device": view.device, "role": view.role.value,
                                                     "pid": view.pid, "load_s": round(view.load_s, 3)})

    def worker_stopped(self, view: WorkerView, state: WorkerState, details: dict | None = None) -> None:
        now = time.time()
        started = self._started.pop(view.worker_id, None)
        if started is not None:
            self.aggregator.stop_worker(view.worker_id, now)
        self.writer.add(WorkerRecord(view.worker_id, view.role, view.device, view.pid, state, started or now, now))
        kind = EventKind.FAILURE if state is WorkerState.FAILED else EventKind.STOP
        self.event(kind, view.worker_id, {"device": view.device, **(details or {})})

    def event(self, kind: EventKind, worker_id: str | None, details: dict) -> None:
        self.writer.add(EventRecord(time.time(), kind, worker_id, details))

    def on_step(self, view: WorkerView, report: StepReport) -> None:
        if view.worker_id not in self._started:
            return
        self.aggregator.add_step(StepRecord(
            worker_id=view.worker_id, ts=report.ended_at, busy_s=report.seconds, phase=report.phase,
            tokens=report.num_tokens, flops=report.flops, bytes=report.bytes, batch_size=report.num_seqs,
            kv_usage=view.kv.usage, queue=report.waiting,
        ))

    def on_request_done(self, req: TrackedRequest) -> None:
        r = req.record()
        outcome = RequestOutcome.ERROR if req.error else (
            RequestOutcome.CANCELLED if req.finish_reason == "abort" else RequestOutcome.OK)
        self.writer.add(RequestRecord(
            request_id=req.request_id, ts=r["arrival"], queue_s=r["queue_s"], prefill_s=r["prefill_s"],
            handoff_bytes=r["handoff_bytes"], handoff_s=r["handoff_s"], ttft_s=r["ttft_s"], decode_s=r["decode_s"],
            e2e_s=r["e2e_s"], prompt_tokens=r["prompt_tokens"], output_tokens=r["output_tokens"],
            prefill_worker=r["prefill_worker"], decode_worker=r["decode_worker"], outcome=outcome,
            prefill_model_s=req.prefill_model_s, decode_model_s=req.decode_model_s,
            prefill_cached_tokens=req.prefill_cached_tokens, prefill_computed_tokens=req.prefill_computed_tokens,
            local_prefill=int(req.local_prefill), host_tier_tokens=req.tier_cached_tokens.get("host", 0),
            disk_tier_tokens=req.tier_cached_tokens.get("disk", 0),
        ))

    def tick(self, now: float | None = None) -> None:
        """Once a second: closed seconds of worker samples, and one GPU sample per device."""
        now = now or time.time()
        self.writer.add_all(self.aggregator.collect(now))
        self.writer.add_all(self.gpus.sample(now))

    def close(self) -> None:
        self.tick(time.time() + self.aggregator.config.grace_s + self.aggregator.config.bucket_s)
        self.gpus.close()
        self.writer.close()
