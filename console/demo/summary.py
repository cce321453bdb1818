"""`fleetctl demo --headless`'s report, read from the metrics store over the run's window: per-pool
busy / MFU / MBU, each phase's share of model time in prefill vs decode (store/classify.py), TTFT and
TPOT percentiles, KV handoffs; plus what the traffic itself counted (requests, errors)."""

import math
import time
from dataclasses import dataclass

from sqlite_utils import Database

from fleetctl.console.demo.schedule import DemoPhase, PhaseShape
from fleetctl.console.demo.traffic import PhaseLog
from fleetctl.domain import WorkerRole
from fleetctl.store.classify import classify
from fleetctl.store.queries import Percentiles, PoolUtilization, handoff_totals, pool_utilization, request_latency

STORE_WAIT_S = 15.0


def wait_for_store(db: Database, phases: list[PhaseLog], timeout: float = STORE_WAIT_S) -> bool:
    """The fleet writes a second's samples about two seconds after it ends and a request's row when it
    finishes: wait until both cover the run. False when `timeout` passed first (the summary then shows
    what is there)."""
    start, end = phases[0].start, _end(phases[-1])
    completed = sum(p.completed for p in phases)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        latest = db.execute("SELECT MAX(ts) FROM worker_samples").fetchone()[0] or 0.0
        finished = db.execute("SELECT COUNT(*) FROM requests WHERE ts >= ? AND ts < ? AND outcome = 'ok'",
                              [start, end]).fetchone()[0]
        if latest >= math.ceil(end) - 1 and finished >= completed:  # the last second that starts before end
            return True
        time.sleep(0.2)
    return False


def _end(log: PhaseLog) -> float:
    if log.end is None:
        raise ValueError(f"phase {log.index} has not ended")
    return log.end


def _pools(pools: dict[WorkerRole, PoolUtilization]) -> dict[str, dict[str, float | int]]:
    return {role.value: {"workers": p.workers, "busy": round(p.window.busy, 4), "mfu": round(p.window.mfu, 6),
                         "mbu": round(p.window.mbu, 6)} for role, p in pools.items()}


def _cuts(p: Percentiles) -> dict[str, float | None]:
    return {"p50": None if p.p50 is None else round(p.p50, 5), "p99": None if p.p99 is None else round(p.p99, 5)}


@dataclass
class _KindTotals:
    """One phase kind over all its phases: the model seconds add up, the shares do not."""

    phases: int = 0
    requests: int = 0  # rows in the store (the server's count)
    prefill_s: float = 0.0
    decode_s: float = 0.0


def _share(prefill_s: float, decode_s: float) -> tuple[float, float]:
    total = prefill_s + decode_s
    return (round(prefill_s / total, 4), round(decode_s / total, 4)) if total > 0 else (0.0, 0.0)


def demo_summary(db: Database, phases: list[PhaseLog], shapes: dict[DemoPhase, PhaseShape],
                 header: dict[str, object], first_error: str | None) -> dict[str, object]:
    """The `fleetctl demo --json` object (its shape is documented on the command)."""
    start, end = phases[0].start, _end(phases[-1])
    window = end - start
    rows = []
    totals: dict[DemoPhase, _KindTotals] = {}
    for log in phases:
        span = _end(log) - log.start
        c = classify(db, span, now=_end(log))
        kind = totals.setdefault(log.phase, _KindTotals())
        kind.phases, kind.requests = kind.phases + 1, kind.requests + c.requests
        kind.prefill_s, kind.decode_s = kind.prefill_s + c.prefill_model_s, kind.decode_s + c.decode_model_s
        rows.append({
            "index": log.index, "kind": log.phase.value,
            "start_s": round(log.start - start, 3), "end_s": round(_end(log) - start, 3),
            "prompt_tokens": list(shapes[log.phase].prompt_tokens),
            "output_tokens": list(shapes[log.phase].output_tokens),
            "requests": log.sent, "completed": log.completed, "errors": log.errors, "cancelled": log.cancelled,
            "arrival_rate": round(log.sent / span, 3) if span > 0 else 0.0,
            "prefill_share": round(c.prefill_share, 4), "decode_share": round(c.decode_share, 4),
            "pools": _pools(pool_utilization(db, span, now=_end(log))),
        })
    by_kind = {}
    for phase, kind in totals.items():
        prefill_share, decode_share = _share(kind.prefill_s, kind.decode_s)
        by_kind[phase.value] = {"phases": kind.phases, "requests": kind.requests, "prefill_share": prefill_share,
                                "decode_share": decode_share}
    latency = request_latency(db, window, now=end)
    handoffs = handoff_totals(db, window, now=end)
    return {
        **header,
        "duration_s": round(window, 3),
        "requests": sum(p.sent for p in phases),
        "completed": sum(p.completed for p in phases),
        "errors": sum(p.errors for p in phases),
        "cancelled": sum(p.cancelled for p in phases),
        "pools": _pools(pool_utilization(db, window, now=end)),
        "phases": rows,
        "by_kind": by_kind,
        "ttft_s": _cuts(latency.ttft),
        "tpot_s": _cuts(latency.tpot),
        "handoffs": {"count": handoffs.count, "bytes": handoffs.bytes, "seconds": round(handoffs.seconds, 4),
                     "share_of_e2e": round(handoffs.share_of_e2e, 6)},
        "first_error": first_error,
    }


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def render_summary(s: dict) -> list[str]:
    """The human-readable summary, one string per line."""
    lines = [f"fleetctl demo: {s['model']} on {s['url']} ({'embedded' if s['embedded'] else 'attached'}), "
             f"{s['duration_s']:.0f} s in phases of {s['phase_seconds']:.0f} s",
             f"requests {s['requests']}  completed {s['completed']}  errors {s['errors']}  "
             f"cancelled at the end {s['cancelled']}", "",
             f"{'pool':<8} {'workers':>7} {'busy':>7} {'mfu':>8} {'mbu':>8}"]
    lines += [f"{role:<8} {p['workers']:>7} {p['busy']:>7.1%} {p['mfu']:>8.2%} {p['mbu']:>8.2%}"
              for role, p in s["pools"].items()]
    lines += ["", f"{'phase':<6} {'kind':<6} {'seconds':>11} {'requests':>8} {'errors':>6} {'prefill':>8} "
                  f"{'decode':>7}   pool busy"]
    for p in s["phases"]:
        busy = "  ".join(f"{role} {pool['busy']:.0%}" for role, pool in p["pools"].items())
        lines.append(f"{p['index']:<6} {p['kind']:<6} {p['start_s']:>5.0f}-{p['end_s']:<5.0f} {p['requests']:>8} "
                     f"{p['errors']:>6} {p['prefill_share']:>8.1%} {p['decode_share']:>7.1%}   {busy}")
    lines += [""] + [f"{kind:<6} model time: prefill {k['prefill_share']:.1%}  decode {k['decode_share']:.1%}  "
                     f"({k['requests']} requests over {k['phases']} phase(s))" for kind, k in s["by_kind"].items()]
    h = s["handoffs"]
    lines += ["", f"TTFT p50 {_ms(s['ttft_s']['p50'])}  p99 {_ms(s['ttft_s']['p99'])}    "
                  f"TPOT p50 {_ms(s['tpot_s']['p50'])}  p99 {_ms(s['tpot_s']['p99'])}",
              f"KV handoffs {h['count']}  {h['bytes'] / 2**20:.1f} MiB  {h['share_of_e2e']:.3%} of end-to-end time"]
    if s["first_error"]:
        lines.append(f"first error: {s['first_error']}")
    if s.get("tour") is not None:
        passed = sum(1 for step in s["tour"] if step["ok"])
        lines += ["", f"tour: {passed} of {len(s['tour'])} step(s) passed"]
        lines += [f"{'ok  ' if t['ok'] else 'FAIL'} {t['name']:<22} {t['seconds']:6.1f} s  {t['result']}"
                  for t in s["tour"]]
    return lines
