"""What `fleetctl plan` needs from the store over a window: the measured steps its cost models are
fitted to, the requests it replays (those that ended in the window), the devices' peaks and the fleet's
layout when the window's last request arrived (its current layout, or the last one of a fleet that has
stopped).

- Prefill steps are rebuilt from the `requests` rows: the requests a step computed share their prefill
  worker and their prefill start (`ts + queue_s`), and each one's `prefill_s` is that step's wall time
  (step start → first token back at the controller).
- Decode runs are the requests' decodes: the wall time from the KV's arrival to the last token over the
  tokens decoded is the step time a client saw, loop overhead included (less, on a mixed worker, the
  prefill steps that stalled it: the replay models those itself). The batch it ran in is the mean of its
  worker's `worker_samples` rows over that time (weighted by their steps); the context, that of the
  requests decoding beside it (each one's grows linearly from its prompt to its prompt + output). Means
  suffice: the decode model is linear in batch and context.
- Handoffs are the requests rows whose KV was handed over (bytes, seconds).
- Stepping time per phase is what the `worker_samples` rows saw: the seconds a worker spent in model
  steps over intervals that ran only that phase, with their tokens and steps. It is the step's FLOPs (or
  bytes) over the device's peak at the MFU (MBU) seen, and what the planner falls back to when a window
  holds too few whole steps to fit a model to.
"""

import bisect
import time
from collections import defaultdict
from dataclasses import dataclass

from sqlite_utils import Database

from fleetctl.domain import DeviceKind, WorkerRole

LOOKBACK_S = 600.0  # requests that arrived this long before the window may still have ended inside it


@dataclass(frozen=True)
class PrefillStep:
    kind: DeviceKind
    tokens: int  # prompt tokens computed in the step
    squares: int  # sum of each prompt's tokens squared (causal attention grows with it)
    seconds: float


@dataclass(frozen=True)
class DecodeRun:
    """One request's decode on one worker: its mean time per step, and the batch and context it ran among."""

    kind: DeviceKind
    steps: int
    batch: float  # mean sequences per step
    context: float  # mean context tokens per step, summed over its sequences
    seconds_per_step: float


@dataclass(frozen=True)
class Handoff:
    kind: DeviceKind  # the receiving worker's device kind
    prompt_tokens: int
    bytes: int
    seconds: float


@dataclass(frozen=True)
class Peaks:
    peak_flops: float
    peak_bytes_per_s: float


@dataclass(frozen=True)
class PhaseBusy:
    """Seconds in model steps, and their tokens and steps, over the intervals of one device kind's workers that
    ran one phase only (an interval that prefilled and decoded is in neither)."""

    prefill_s: float = 0.0
    prefill_tokens: int = 0
    decode_s: float = 0.0
    decode_steps: int = 0


@dataclass(frozen=True)
class WindowRequest:
    arrival_s: float  # since the window's first arrival
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int = 0  # prompt tokens the prefix cache served
    local: bool = False  # prefilled on its decode worker, with no handoff (conditional disaggregation)


@dataclass(frozen=True)
class LiveWorker:
    worker_id: str
    role: WorkerRole
    device: str


@dataclass(frozen=True)
class PlanInputs:
    window_s: float
    requests: list[WindowRequest]
    prefill_steps: list[PrefillStep]
    decode_runs: list[DecodeRun]
    handoffs: list[Handoff]
    peaks: dict[DeviceKind, Peaks]  # implied by the samples: flops / (mfu · interval), bytes likewise
    busy: dict[DeviceKind, PhaseBusy]
    workers: list[LiveWorker]  # the layout when the window's last request arrived


def device_kind(device: str) -> DeviceKind:
    return DeviceKind(device.split(":", 1)[0])


def plan_inputs(db: Database, window_s: float, now: float | None = None) -> PlanInputs:
    now = time.time() if now is None else now
    since = now - window_s
    devices = {wid: device for wid, device in db.execute("SELECT id, device FROM workers")}
    rows = db.execute(
        "SELECT ts, queue_s, prefill_s, ttft_s, e2e_s, handoff_s, handoff_bytes, prompt_tokens, output_tokens, "
        "prefill_worker, decode_worker, prefill_cached_tokens, local_prefill FROM requests "
        "WHERE ts >= ? AND ts < ? ORDER BY ts",
        [since - LOOKBACK_S, now]).fetchall()
    # the requests that ended in the window: a window shorter than the latencies still holds requests
    in_window = [r for r in rows if r[0] + r[4] >= since]
    first = in_window[0][0] if in_window else since
    return PlanInputs(
        window_s=window_s,
        requests=[WindowRequest(r[0] - first, r[7], r[8], r[11], bool(r[12])) for r in in_window
                  if r[7] > 0 and r[8] > 0],
        prefill_steps=_prefill_steps(in_window, devices),
        decode_runs=_decode_runs(db, rows, devices, since, now),
        handoffs=[Handoff(device_kind(devices[r[10]]), r[7], r[6], r[5]) for r in in_window
                  if r[6] > 0 and r[10] in devices],
        peaks=_peaks(db, devices, since, now),
        busy=_phase_busy(db, devices, since, now),
        workers=_live_workers(db, in_window[-1][0] if in_window else None),
    )


def _prefill_groups(rows: list[tuple]) -> dict[tuple[str, float], list[tuple[int, float]]]:
    """(worker, start) of each prefill step -> (prompt tokens computed, prefill seconds) of each request in it
    (a prompt's tokens the prefix cache served cost the step nothing). A prompt its decode worker prefilled
    itself (conditional disaggregation) counts too, on that worker: on agent traffic most prompts are."""
    steps: dict[tuple[str, float], list[tuple[int, float]]] = defaultdict(list)
    for ts, queue_s, prefill_s, *_, prompt, _out, prefill_worker, decode_worker, cached, local in rows:
        worker = decode_worker if local else prefill_worker
        if worker is not None and prefill_s > 0 and prompt - cached > 0:
            steps[(worker, round(ts + queue_s, 4))].append((prompt - cached, prefill_s))
    return steps


def _prefill_steps(rows: list[tuple], devices: dict[str, str]) -> list[PrefillStep]:
    return [PrefillStep(device_kind(devices[wid]), sum(p for p, _ in members), sum(p * p for p, _ in members),
                        max(s for _, s in members)) for (wid, _), members in _prefill_groups(rows).items()
            if wid in devices]


def _decode_runs(db: Database, rows: list[tuple], devices: dict[str, str], since: float,
                 now: float) -> list[DecodeRun]:
    spans: dict[str, list[tuple[float, float, int, int]]] = defaultdict(list)  # (start, end, ctx0, ctx1)
    for ts, _q, _p, ttft_s, e2e_s, handoff_s, _b, prompt, out, prefill_worker, decode_worker, *_ in rows:
        worker = decode_worker or prefill_worker
        start, end = ts + ttft_s + handoff_s, ts + e2e_s
        if worker in devices and out > 1 and end > start:
            spans[worker].append((start, end, prompt + 1, prompt + out))
    prefills: dict[str, list[tuple[float, float]]] = defaultdict(list)  # (start, end) of each prefill step
    for (wid, start), members in _prefill_groups(rows).items():
        prefills[wid].append((start, start + max(s for _, s in members)))
    samples: dict[str, list[tuple[float, float, int, float]]] = defaultdict(list)
    for wid, ts, interval, steps, batch in db.execute(
            "SELECT worker_id, ts, interval_s, steps, batch_size FROM worker_samples WHERE ts >= ? AND ts < ? "
            "AND role IN (?, ?) ORDER BY ts",
            [since - LOOKBACK_S, now, WorkerRole.DECODE.value, WorkerRole.MIXED.value]):
        samples[wid].append((ts, interval, steps, batch))
    result = []
    for wid, worker_spans in spans.items():
        starts = [row[0] for row in samples[wid]]
        for start, end, ctx0, ctx1 in worker_spans:
            if start < since:
                continue
            batch = _mean_batch(samples[wid][max(0, bisect.bisect_left(starts, start) - 1):
                                             bisect.bisect_left(starts, end)], start, end)
            per_sequence = _mean_context(worker_spans, start, end)
            stalled = sum(max(0.0, min(b, end) - max(a, start)) for a, b in prefills[wid])
            seconds = (end - start - stalled) / (ctx1 - ctx0)
            if batch > 0 and seconds > 0:
                result.append(DecodeRun(device_kind(devices[wid]), ctx1 - ctx0, batch, batch * per_sequence,
                                        seconds))
    return result


def _mean_batch(samples: list[tuple[float, float, int, float]], lo: float, hi: float) -> float:
    """Sequences per step over [lo, hi), from the worker's rows (each weighted by its steps in the span)."""
    steps = weighted = 0.0
    for ts, interval, count, batch in samples:
        share = max(0.0, min(ts + interval, hi) - max(ts, lo)) / interval
        steps += count * share
        weighted += count * share * batch
    return weighted / steps if steps > 0 else 0.0


def _mean_context(spans: list[tuple[float, float, int, int]], lo: float, hi: float) -> float:
    """Context tokens of the sequences decoding over [lo, hi), time-weighted per sequence (each one's context
    grows linearly over its span)."""
    held = context_time = 0.0
    for start, end, ctx0, ctx1 in spans:
        a, b = max(start, lo), min(end, hi)
        if b > a:
            held += b - a
            context_time += (b - a) * (ctx0 + (ctx1 - ctx0) * ((a + b) / 2 - start) / (end - start))
    return context_time / held if held > 0 else 0.0


def _peaks(db: Database, devices: dict[str, str], since: float, now: float) -> dict[DeviceKind, Peaks]:
    sums: dict[DeviceKind, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for wid, flops, mfu_s, nbytes, mbu_s in db.execute(
            "SELECT worker_id, TOTAL(flops), TOTAL(mfu * interval_s), TOTAL(bytes), TOTAL(mbu * interval_s) "
            "FROM worker_samples WHERE ts >= ? AND ts < ? GROUP BY worker_id", [since, now]):
        if wid in devices:
            total = sums[device_kind(devices[wid])]
            for i, value in enumerate((flops, mfu_s, nbytes, mbu_s)):
                total[i] += value
    return {kind: Peaks(flops / mfu_s, nbytes / mbu_s) for kind, (flops, mfu_s, nbytes, mbu_s) in sums.items()
            if mfu_s > 0 and mbu_s > 0}


def _phase_busy(db: Database, devices: dict[str, str], since: float, now: float) -> dict[DeviceKind, PhaseBusy]:
    sums: dict[DeviceKind, list[float]] = defaultdict(lambda: [0.0, 0, 0.0, 0])
    for wid, seconds, prefill_tokens, steps in db.execute(
            "SELECT worker_id, busy * interval_s, prefill_tokens, steps FROM worker_samples "
            "WHERE ts >= ? AND ts < ? AND busy > 0 AND (prefill_tokens = 0) != (decode_tokens = 0)", [since, now]):
        if wid in devices:
            total = sums[device_kind(devices[wid])]
            if prefill_tokens:
                total[0] += seconds
                total[1] += prefill_tokens
            else:
                total[2] += seconds
                total[3] += steps
    return {kind: PhaseBusy(*values) for kind, values in sums.items()}


def _live_workers(db: Database, at: float | None) -> list[LiveWorker]:
    """The workers running at `at` (None: none)."""
    if at is None:
        return []
    rows = db.execute("SELECT id, role, device FROM workers WHERE started_at <= ? AND (stopped_at IS NULL OR "
                      "stopped_at >= ?) ORDER BY id", [at, at]).fetchall()
    return [LiveWorker(wid, WorkerRole(role), device) for wid, role, device in rows]
