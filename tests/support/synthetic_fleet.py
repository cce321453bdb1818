"""A store as a 1 prefill + 1 decode fleet with known step costs would have written it: requests rows and
per-second worker samples (through the real StepAggregator) from an explicit step-by-step schedule,
independent of the planner's own simulator. The planner's fit should recover the costs from it. And the
device-peak cache as a CPU calibration and a GPU's spec-table entry leave it (`write_device_peaks`)."""

import random
from dataclasses import dataclass
from pathlib import Path

from fleetctl.domain import DeviceKind, PeakSource, Phase, RequestOutcome, WorkerRole, WorkerState
from fleetctl.store.aggregate import StepAggregator, StepRecord
from fleetctl.store.db import open_db
from fleetctl.store.device_peak_cache import save_device
from fleetctl.store.records import DeviceRecord, RequestRecord, WorkerRecord
from fleetctl.store.writer import MetricsWriter, WriterConfig

T0 = 1_000_000.0
PEAK_FLOPS, PEAK_BYTES = 1e12, 1e11
FLOPS_PER_TOKEN, BYTES_PER_STEP = 1e9, 1e9
DEVICE_PEAKS = (  # by identity, as the store lists them
    DeviceRecord("cpu:Synthetic CPU:2threads:64MiB", "float32", DeviceKind.CPU, "Synthetic CPU", None, 2.5e11, 2e10,
                 PeakSource.CALIBRATED, T0),
    DeviceRecord("cuda:NVIDIA H200", "bfloat16", DeviceKind.CUDA, "NVIDIA H200", "550.54", 9.89e14, 4.8e12,
                 PeakSource.SPEC_TABLE, T0 + 60),
)


@dataclass(frozen=True)
class TrueCosts:
    prefill: tuple[float, float, float] = (0.02, 4e-4, 5e-8)  # seconds: 1, tokens, tokens²
    decode: tuple[float, float, float] = (0.03, 2e-3, 2e-6)  # seconds: 1, batch, context
    handoff: tuple[float, float] = (0.002, 1e-9)  # seconds: 1, bytes
    kv_bytes_per_token: int = 50_000

    def prefill_s(self, tokens: int) -> float:
        a, b, c = self.prefill
        return a + b * tokens + c * tokens * tokens

    def decode_s(self, batch: int, context: int) -> float:
        a, b, c = self.decode
        return a + b * batch + c * context

    def handoff_s(self, tokens: int) -> float:
        return self.handoff[0] + self.handoff[1] * tokens * self.kv_bytes_per_token


def workload(kind: str, count: int, rate: float, seed: int = 0) -> list[tuple[float, int, int]]:
    """(arrival offset, prompt tokens, output tokens): `rag` long prompts and short answers, `agent` short
    prompts and long answers (decode-dominated, as with its context cached)."""
    rng = random.Random(seed)
    prompts, outputs = {"rag": ((1500, 2500), (16, 32)), "agent": ((64, 192), (150, 250))}[kind]
    clock, result = 0.0, []
    for _ in range(count):
        result.append((clock, rng.randint(*prompts), rng.randint(*outputs)))
        clock += rng.expovariate(rate)
    return result


def write_store(path: Path, requests: list[tuple[float, int, int]], costs: TrueCosts = TrueCosts(),
                t0: float = T0) -> float:
    """Run `requests` (arriving from `t0` on) through prefill-0 @ cpu:0 and decode-0 @ cpu:1 step by step and
    write what the fleet would have recorded; returns the time just after the last answer (the window's `now`)."""
    steps: list[StepRecord] = []
    free_at, ready = t0, []  # the prefill worker, FIFO one prompt per step
    rows = {}
    for i, (offset, prompt, _out) in enumerate(requests):
        arrival = t0 + offset
        start = max(arrival, free_at)
        free_at = start + costs.prefill_s(prompt)
        steps.append(_step("prefill-0", free_at, free_at - start, Phase.PREFILL, prompt, 1))
        rows[i] = dict(ts=arrival, queue_s=start - arrival, prefill_s=free_at - start, ttft_s=free_at - arrival)
        ready.append((free_at + costs.handoff_s(prompt), i))
    ready.sort()
    clock, running, tokens = t0, [], {}
    while ready or running:
        if not running and ready and ready[0][0] > clock:
            clock = ready[0][0]
        while ready and ready[0][0] <= clock:
            running.append(ready.pop(0)[1])
            tokens[running[-1]] = 1
        context = sum(requests[i][1] + tokens[i] for i in running)
        seconds = costs.decode_s(len(running), context)
        clock += seconds
        steps.append(_step("decode-0", clock, seconds, Phase.DECODE, len(running), len(running)))
        for i in list(running):
            tokens[i] += 1
            if tokens[i] >= requests[i][2]:
                running.remove(i)
                rows[i]["e2e_s"] = clock - rows[i]["ts"]
    now = clock + 2.0
    aggregator = StepAggregator()
    for wid, role in (("prefill-0", WorkerRole.PREFILL), ("decode-0", WorkerRole.DECODE)):
        aggregator.add_worker(wid, role, PEAK_FLOPS, PEAK_BYTES, t0 - 1)
    for step in sorted(steps, key=lambda s: s.ts):
        aggregator.add_step(step)
    for wid in ("prefill-0", "decode-0"):
        aggregator.stop_worker(wid, now)
    with MetricsWriter(path, WriterConfig(retention=None)) as writer:
        writer.add(WorkerRecord("prefill-0", WorkerRole.PREFILL, "cpu:0", 1, WorkerState.RUNNING, t0 - 1))
        writer.add(WorkerRecord("decode-0", WorkerRole.DECODE, "cpu:1", 2, WorkerState.RUNNING, t0 - 1))
        writer.add_all(aggregator.collect(now))
        for i, row in rows.items():
            prompt, out = requests[i][1], requests[i][2]
            handoff_s = costs.handoff_s(prompt)
            writer.add(RequestRecord(
                request_id=f"r{i}", ts=row["ts"], queue_s=row["queue_s"], prefill_s=row["prefill_s"],
                handoff_bytes=prompt * costs.kv_bytes_per_token, handoff_s=handoff_s, ttft_s=row["ttft_s"],
                decode_s=row["e2e_s"] - row["ttft_s"], e2e_s=row["e2e_s"], prompt_tokens=prompt, output_tokens=out,
                prefill_worker="prefill-0", decode_worker="decode-0", outcome=RequestOutcome.OK,
                prefill_model_s=row["prefill_s"], decode_model_s=0.0))
    return now


def _step(wid: str, end: float, seconds: float, phase: Phase, tokens: int, batch: int) -> StepRecord:
    return StepRecord(wid, end, seconds, phase, tokens, tokens * FLOPS_PER_TOKEN, BYTES_PER_STEP, batch, 0.1, 0)


def write_device_peaks(path: Path) -> None:
    """DEVICE_PEAKS into the store's device-peak cache."""
    db = open_db(path)
    try:
        for record in DEVICE_PEAKS:
            save_device(db, record)
    finally:
        db.close()
