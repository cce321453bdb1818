"""What `fleetctl plan` needs from the store over a window: the measured steps its cost models are
fitted to, the requests it replays, the devices' peaks and the fleet's layout at the window's end.

- Prefill steps are rebuilt from the `requests` rows: the requests a step computed share their prefill
  worker and their prefill start (`ts + queue_s`), and each one's `prefill_s` is that step's wall time
  (step start → first token back at the controller).
- Decode seconds are the `worker_samples` rows of decode (and mixed) workers that ran decode steps only.
  A row says how many steps ran and their mean batch; the context those steps read comes from the
  requests decoding on that worker meanwhile (each one's context grows linearly from its prompt to its
  prompt + output over its decode interval). A step's time is the wall time the worker held sequences
  in that second divided by its steps: the cadence a client sees, loop overhead included.
- Handoffs are the requests rows whose KV was handed over (bytes, seconds).
"""

import time
from collections import defaultdict
from dataclasses import dataclass

from sqlite_utils import Database

from fleetctl.store.records import DeviceKind, WorkerRole

LOOKBACK_S = 600.0  # requests that arrived this long before the window may still have decoded inside it
LIVE_TAIL_S = 5.0  # workers with samples this close to the window's last sample make up its layout
MIN_COVERED = 0.25  # share of a row's interval with sequences held, below which its cadence is boundary noise


@dataclass(frozen=True)
class PrefillStep:
    kind: DeviceKind
    tokens: int  # prompt tokens computed in the step
    squares: int  # sum of each prompt's tokens squared (causal attention grows with it)
    seconds: float


@dataclass(frozen=True)
class DecodeSecond:
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
class WindowRequest:
    arrival_s: float  # since the window's first arrival
    prompt_tokens: int
    output_tokens: int


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
    decode_seconds: list[DecodeSecond]
    handoffs: list[Handoff]
    peaks: dict[DeviceKind, Peaks]  # implied by the samples: flops / (mfu · interval), bytes likewise
    workers: list[LiveWorker]  # the layout at the window's end


def device_kind(device: str) -> DeviceKind:
    return DeviceKind(device.split(":", 1)[0])


def plan_inputs(db: Database, window_s: float, now: float | None = None) -> PlanInputs:
    now = time.time() if now is None else now
    since = now - window_s
    devices = {wid: device for wid, device in db.execute("SELECT id, device FROM workers")}
    rows = db.execute(
        "SELECT ts, queue_s, prefill_s, ttft_s, e2e_s, handoff_s, handoff_bytes, prompt_tokens, output_tokens, "
        "prefill_worker, decode_worker FROM requests WHERE ts >= ? AND ts < ? ORDER BY ts",
        [since - LOOKBACK_S, now]).fetchall()
    in_window = [r for r in rows if r[0] >= since]
    first = in_window[0][0] if in_window else since
    return PlanInputs(
        window_s=window_s,
        requests=[WindowRequest(r[0] - first, r[7], r[8]) for r in in_window if r[7] > 0 and r[8] > 0],
        prefill_steps=_prefill_steps(in_window, devices),
        decode_seconds=_decode_seconds(db, rows, devices, since, now),
        handoffs=[Handoff(device_kind(devices[r[10]]), r[7], r[6], r[5]) for r in in_window
                  if r[6] > 0 and r[10] in devices],
        peaks=_peaks(db, devices, since, now),
        workers=_live_workers(db, since, now),
    )


def _prefill_steps(rows: list[tuple], devices: dict[str, str]) -> list[PrefillStep]:
    steps: dict[tuple[str, float], list[tuple[int, float]]] = defaultdict(list)
    for ts, queue_s, prefill_s, *_, prompt, _out, prefill_worker, _decode in rows:
        if prefill_worker in devices and prefill_s > 0 and prompt > 0:
            steps[(prefill_worker, round(ts + queue_s, 4))].append((prompt, prefill_s))
    return [PrefillStep(device_kind(devices[wid]), sum(p for p, _ in members), sum(p * p for p, _ in members),
                        max(s for _, s in members)) for (wid, _), members in steps.items()]


def _decode_seconds(db: Database, rows: list[tuple], devices: dict[str, str], since: float,
                    now: float) -> list[DecodeSecond]:
    # per worker: (start, end, context at start, context at end) of each request's decode
    spans: dict[str, list[tuple[float, float, int, int]]] = defaultdict(list)
    for ts, _q, _p, ttft_s, e2e_s, handoff_s, _b, prompt, out, prefill_worker, decode_worker in rows:
        worker = decode_worker or prefill_worker
        start, end = ts + ttft_s + handoff_s, ts + e2e_s
        if worker is not None and out > 1 and end > start:
            spans[worker].append((start, end, prompt + 1, prompt + out))
    result = []
    for wid, ts, interval, steps, batch in db.execute(
            "SELECT worker_id, ts, interval_s, steps, batch_size FROM worker_samples WHERE ts >= ? AND ts < ? "
            "AND role IN (?, ?) AND steps > 0 AND decode_tokens > 0 AND prefill_tokens = 0",
            [since, now, WorkerRole.DECODE.value, WorkerRole.MIXED.value]):
        if wid not in devices:
            continue
        covered, context_time = _coverage(spans.get(wid, []), ts, ts + interval)
        if covered >= MIN_COVERED * interval:
            result.append(DecodeSecond(device_kind(devices[wid]), steps, batch, context_time / covered,
                                       covered / steps))
    return result


def _coverage(spans: list[tuple[float, float, int, int]], lo: float, hi: float) -> tuple[float, float]:
    """(seconds of [lo, hi) during which at least one span was open, ∫ the open spans' summed context dt)."""
    pieces, context_time = [], 0.0
    for start, end, ctx0, ctx1 in spans:
        a, b = max(start, lo), min(end, hi)
        if b <= a:
            continue
        pieces.append((a, b))
        middle = (a + b) / 2
        context_time += (b - a) * (ctx0 + (ctx1 - ctx0) * (middle - start) / (end - start))
    covered, reach = 0.0, lo
    for a, b in sorted(pieces):
        if b > reach:
            covered += b - max(a, reach)
            reach = b
    return covered, context_time


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


def _live_workers(db: Database, since: float, now: float) -> list[LiveWorker]:
    last = db.execute("SELECT MAX(ts) FROM worker_samples WHERE ts >= ? AND ts < ?", [since, now]).fetchone()[0]
    if last is None:
        return []
    rows = db.execute(
        "SELECT id, role, device FROM workers WHERE (stopped_at IS NULL OR stopped_at > ?) AND id IN "
        "(SELECT DISTINCT worker_id FROM worker_samples WHERE ts >= ? AND ts <= ?) ORDER BY id",
        [last, last - LIVE_TAIL_S, last]).fetchall()
    return [LiveWorker(wid, WorkerRole(role), device) for wid, role, device in rows]
