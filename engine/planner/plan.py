"""`plan`: fit the cost models to the window's measured steps, replay its requests (or a trace) through
every prefill:decode split of the devices and through colocated, rank the layouts by goodput, and say
why the first one wins, with the numbers that decided it.

Goodput is the requests that meet both SLOs per second of the replay (first arrival to last answer).
Layouts whose goodputs agree to three significant digits tie, and a tie goes to the layout with the
most headroom (its worse p90 latency as a fraction of its SLO), and where that ties too, to the current
layout.

Elastic (`plan --elastic`; a fleet's own plan when `serve --devices` lists more devices than it runs
workers on, up to autoplan's `--max-workers`): the layouts of every number of those devices are replayed,
and of those within ENOUGH_PCT of the best goodput the one on the fewest devices wins — a device that adds
next to nothing is better left free."""

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from fleetctl.domain import WorkerRole
from fleetctl.engine.planner.advice import Advice, Band, advise, corners
from fleetctl.engine.planner.costs import DeviceCosts, fit_costs, measured_kinds
from fleetctl.engine.planner.durations import format_window
from fleetctl.engine.planner.plan_devices import PlanDevices, parse_devices
from fleetctl.engine.planner.simulator import EngineLimits, SimRequest, Timing, simulate
from fleetctl.engine.planner.slo import Slo
from fleetctl.engine.planner.split import Layout, Split, splits_of, splits_up_to
from fleetctl.errors import UserError
from fleetctl.store.db import open_db
from fleetctl.store.plan_inputs import LiveWorker, PlanInputs, plan_inputs
from fleetctl.store.queries import percentiles

ENOUGH_PCT = 5.0  # elastic: a layout this close to the best goodput is enough, and the fewest devices win


@dataclass(frozen=True)
class PlanRequest:
    slo: Slo = field(default_factory=Slo)
    devices: str | None = None  # --devices as given; None: the fleet's own
    trace: tuple[SimRequest, ...] | None = None  # replayed instead of the window's requests
    limits: EngineLimits = field(default_factory=EngineLimits)
    elastic: bool = False  # rank layouts on any number of the devices (`plan --elastic`, a fleet with free devices)


@dataclass(frozen=True)
class Candidate:
    split: Split
    requests: int
    good: int  # requests meeting both SLOs
    goodput: float  # good requests per second of the replay
    ttft_p90_s: float
    tpot_p90_s: float | None  # None when every answer is one token
    e2e_mean_s: float
    spread: tuple[float, float] | None = None  # the goodput replayed at the cost models' error ends (advice.py)

    @property
    def band(self) -> Band:
        low, high = self.spread or (self.goodput, self.goodput)
        return Band(min(low, self.goodput), max(high, self.goodput))

    @property
    def rounded_goodput(self) -> float:
        """What ranks it: goodputs closer than this are a tie."""
        return float(f"{self.goodput:.3g}")

    def headroom(self, slo: Slo) -> float:
        """The worse p90 latency as a fraction of its SLO (lower is better)."""
        return max(self.ttft_p90_s / slo.ttft_s, (self.tpot_p90_s or 0.0) / slo.tpot_s)

    def rounded_headroom(self, slo: Slo) -> float:
        """What ranks a goodput tie: headrooms closer than this are a tie too."""
        return float(f"{self.headroom(slo):.3g}")

    def as_json(self) -> dict[str, object]:
        return {**self.split.as_json(), "goodput": round(self.goodput, 4), "ttft_p90_s": round(self.ttft_p90_s, 4),
                "tpot_p90_s": None if self.tpot_p90_s is None else round(self.tpot_p90_s, 5),
                "good_requests": self.good, "requests": self.requests, "e2e_mean_s": round(self.e2e_mean_s, 4),
                "goodput_band": [round(self.band.low, 4), round(self.band.high, 4)]}


def score(split: Split, timings: list[Timing], slo: Slo) -> Candidate:
    span = max(t.arrival_s + t.e2e_s for t in timings) - min(t.arrival_s for t in timings)
    good = sum(slo.met(t.ttft_s, t.tpot_s) for t in timings)
    tpots = [t.tpot_s for t in timings if t.tpot_s is not None]
    return Candidate(split, len(timings), good, good / span if span > 0 else math.inf,
                     percentiles([t.ttft_s for t in timings]).p90 or 0.0, percentiles(tpots).p90,
                     sum(t.e2e_s for t in timings) / len(timings))


@dataclass(frozen=True)
class Plan:
    window_s: float
    source: str  # "store" (the window's requests) or "trace"
    slo: Slo
    devices: PlanDevices
    costs: DeviceCosts  # as replayed (scaled for a what-if fleet)
    current: Split | None  # the fleet's layout (when the window's last request arrived, from the store)
    candidates: list[Candidate]  # best first
    notes: list[str]  # assumptions the numbers rest on
    elastic: bool = False  # the candidates use any number of the devices
    advice: Advice | None = None  # what to do, as far as the bands tell (advice.py)

    @property
    def recommended(self) -> Candidate:
        return self.candidates[0]

    @property
    def best_split(self) -> Candidate | None:
        """The best prefill:decode split (the recommended layout may be colocated)."""
        return next((c for c in self.candidates if c.split.layout is Layout.DISAGGREGATED), None)

    def candidate(self, split: Split | None) -> Candidate | None:
        """`split`'s result, if it was replayed on the fleet's own devices."""
        if split is None or self.devices.gpu is not None:
            return None
        return next((c for c in self.candidates if c.split == split), None)

    def gain_pct(self) -> float | None:
        """Predicted goodput gain of the recommended layout over the current one, in percent (None when the
        current one was not replayed; inf when it serves nothing within the SLOs and the recommended one does)."""
        best, now = self.recommended, self.candidate(self.current)
        if best is None or now is None:
            return None
        if now.goodput == 0:
            return math.inf if best.goodput > 0 else 0.0
        return 100 * (best.goodput - now.goodput) / now.goodput

    def gain_json(self) -> float | str | None:
        """`gain_pct` for JSON: rounded, "inf" when the current split serves nothing within the SLOs."""
        gain = self.gain_pct()
        return None if gain is None else (round(gain, 2) if math.isfinite(gain) else "inf")

    @property
    def reason(self) -> str:
        return explain(self)

    def as_json(self) -> dict[str, object]:
        """DESIGN's `plan --json` shape (`recommended`, `current`, `candidates`, `reason`) and more."""
        best = self.best_split
        return {
            "recommended": self.recommended.split.as_json(),
            "current": self.current.as_json() if self.current else None,
            "candidates": [c.as_json() for c in self.candidates],
            "reason": self.reason,
            "best_split": best.split.as_json() if best else None,
            "gain_pct": self.gain_json(),
            "window_s": self.window_s,
            "source": self.source,
            "requests": self.recommended.requests,
            "slo": {"ttft_s": self.slo.ttft_s, "tpot_s": self.slo.tpot_s},
            "devices": list(self.devices.names),
            "what_if": self.devices.as_json(),
            "fit": self.costs.as_json(),
            "notes": self.notes,
            "elastic": self.elastic,
            "advice": self.advice.as_json() if self.advice else None,
        }

    def advised(self, held: Split | None = None, held_since: float | None = None, at: float | None = None) -> "Plan":
        """This plan with its advice, given the layout a previous advice held (hysteresis); `at`: when replayed."""
        current = self.candidate(self.current)
        return replace(self, advice=advise(self.candidates, current, self.elastic, held, held_since, at))


def current_split(workers: list[LiveWorker]) -> Split | None:
    counts = {role: sum(w.role is role for w in workers) for role in WorkerRole}
    if counts[WorkerRole.MIXED] and not (counts[WorkerRole.PREFILL] or counts[WorkerRole.DECODE]):
        return Split(mixed=counts[WorkerRole.MIXED])
    if counts[WorkerRole.PREFILL] and counts[WorkerRole.DECODE] and not counts[WorkerRole.MIXED]:
        return Split(counts[WorkerRole.PREFILL], counts[WorkerRole.DECODE])
    return None


def make_plan(inputs: PlanInputs, request: PlanRequest, workers: list[LiveWorker] | None = None) -> Plan:
    """`workers`: the fleet's live workers (default: those the store shows serving the window's last request)."""
    workers = inputs.workers if workers is None else workers
    source = "trace" if request.trace is not None else "store"
    replay = list(request.trace) if request.trace is not None else [
        SimRequest(r.arrival_s, r.prompt_tokens, r.output_tokens, min(r.cached_tokens, r.prompt_tokens - 1), r.local)
        for r in inputs.requests]
    if not replay:
        raise UserError(f"no requests to replay: the last {format_window(inputs.window_s)} of the store hold none "
                        f"(send traffic, e.g. `fleetctl bench`, widen --since, or give --trace)")
    if request.devices is not None:
        devices = parse_devices(request.devices)
    elif workers:
        devices = parse_devices(",".join(w.device for w in workers))
    else:
        raise UserError("the store shows no worker serving the window's requests: name the devices with --devices")
    kinds = measured_kinds(inputs)
    if not kinds:
        raise UserError(f"no measured steps in the last {format_window(inputs.window_s)} of the store to fit a cost "
                        f"model to")
    measured_kind = kinds[0] if devices.gpu else devices.kind
    if measured_kind not in kinds:
        raise UserError(f"the window has no {measured_kind.value} measurements to cost {devices.label} with "
                        f"(use NxGPU, e.g. 8xH100, for a what-if fleet)")
    costs, what_if = devices.costs_from(fit_costs(inputs, measured_kind))
    notes = [what_if] if what_if else []
    notes.extend(fallback.note for fallback in costs.fallbacks)
    if costs.handoff is None and len(devices.names) > 1:
        notes.append("handoff: no KV handoff in the window (no disaggregated traffic), so it is taken as free")
    current = current_split(workers)
    layouts = splits_up_to(len(devices.names)) if request.elastic else splits_of(len(devices.names))
    candidates = [score(split, simulate(replay, split, costs, request.limits), request.slo) for split in layouts]
    ends = [[score(split, simulate(replay, split, end, request.limits), request.slo).goodput for end in corners(costs)]
            for split in layouts]
    candidates = [replace(c, spread=(min(e), max(e))) for c, e in zip(candidates, ends, strict=True)]
    return Plan(inputs.window_s, source, request.slo, devices, costs, current,
                rank(candidates, request.slo, current, request.elastic), notes, request.elastic).advised()


def rank(candidates: list[Candidate], slo: Slo, current: Split | None, elastic: bool = False) -> list[Candidate]:
    """Best first: goodput, then headroom, then the current layout (equal on both, there is no reason to move).
    `elastic`: the layouts within ENOUGH_PCT of the best goodput first, the fewest devices first among them."""
    top = max(c.rounded_goodput for c in candidates)

    def enough(c: Candidate) -> bool:  # where nothing meets the SLOs, the closest wins whatever it takes
        return elastic and top > 0 and c.rounded_goodput >= top * (1 - ENOUGH_PCT / 100)

    return sorted(candidates, key=lambda c: (not enough(c), c.split.devices if enough(c) else 0, -c.rounded_goodput,
                                             c.rounded_headroom(slo), c.split != current, c.split.label))


def plan_from_store(path: Path, window_s: float, request: PlanRequest, workers: list[LiveWorker] | None = None,
                    now: float | None = None) -> Plan:
    """Plan over the last `window_s` seconds of the store at `path`."""
    if not path.exists():
        raise UserError(f"no metrics store at {path} (run a fleet with `fleetctl serve` first, or pass --store)")
    db = open_db(path)  # one connection per call, in the calling thread
    try:
        inputs = plan_inputs(db, window_s, now)
    finally:
        db.close()
    return make_plan(inputs, request, workers)


def _rate(c: Candidate) -> str:
    return f"{c.goodput:.3g} req/s ({c.good}/{c.requests} requests)"


def _worst(c: Candidate, slo: Slo) -> str:
    if c.ttft_p90_s / slo.ttft_s >= (c.tpot_p90_s or 0.0) / slo.tpot_s:
        return f"TTFT p90 is {c.ttft_p90_s:.3g} s"
    return f"TPOT p90 is {c.tpot_p90_s:.3g} s"


def explain(plan: Plan) -> str:
    """One sentence: the winner, what it serves within the SLOs, and what it beats and why; and when a phase's
    costs were not fitted to its steps, that the numbers are rougher."""
    rough = [fallback.phase for fallback in plan.costs.fallbacks]
    if not rough:
        return _compare(plan)
    return (f"{_compare(plan)} (rough: too few {' and '.join(rough)} steps in the window to fit, so "
            f"{'they are' if len(rough) > 1 else 'it is'} costed from the workers' stepping time)")


def _compare(plan: Plan) -> str:
    best, slo = plan.recommended, plan.slo
    current = plan.candidate(plan.current)
    others = [c for c in plan.candidates if c is not best]
    most = max(plan.candidates, key=lambda c: (c.rounded_goodput, -c.split.devices))
    if plan.elastic and most.rounded_goodput > best.rounded_goodput:
        now = "" if current is None or current in (best, most) else (
            f"; the current {current.split.label} serves {current.goodput:.3g} req/s")
        return (f"{best.split.label} is best: {_rate(best)} within {slo.describe()} on {best.split.devices} of the "
                f"{len(plan.devices.names)} devices, within {ENOUGH_PCT:g} % of the most any layout serves "
                f"({most.split.label}: {most.goodput:.3g} req/s on {most.split.devices}){now}")
    if not others:
        return f"{best.split.label} is the only layout of {plan.devices.label}: {_rate(best)} within {slo.describe()}"
    if current is best:
        rival, opening = others[0], f"the current {best.split.label} is already best"
    else:
        rival = current or others[0]
        opening = f"{best.split.label} is best"
    name = f"the current {rival.split.label}" if rival is current else f"the next best ({rival.split.label})"
    if best.good == 0:
        sentence = (f"no layout answers any request within {slo.describe()}; {best.split.label} comes closest: its "
                    f"worse p90 is {best.headroom(slo):.3g}x its SLO vs {rival.headroom(slo):.3g}x for {name}")
    elif rival.rounded_goodput == best.rounded_goodput and plan.elastic and best.split.devices < rival.split.devices:
        sentence = (f"{opening}: it and {name} both serve {_rate(best)} within {slo.describe()}, and "
                    f"{best.split.label} needs fewer devices ({best.split.devices} vs {rival.split.devices} of "
                    f"{len(plan.devices.names)})")
    elif rival.rounded_goodput == best.rounded_goodput:
        margin = "more" if best.rounded_headroom(slo) < rival.rounded_headroom(slo) else "as much"
        sentence = (f"{opening}: it and {name} both serve {_rate(best)} within {slo.describe()}, and "
                    f"{best.split.label} has {margin} headroom (TTFT p90 {best.ttft_p90_s:.3g} s vs "
                    f"{rival.ttft_p90_s:.3g} s, TPOT p90 {best.tpot_p90_s or 0:.3g} s vs "
                    f"{rival.tpot_p90_s or 0:.3g} s)")
    elif rival.good < best.good:
        sentence = (f"{opening}: {_rate(best)} within {slo.describe()} vs {rival.goodput:.3g} req/s for {name}, "
                    f"whose {_worst(rival, slo)}")
    else:
        sentence = (f"{opening}: {_rate(best)} within {slo.describe()} vs {rival.goodput:.3g} req/s for {name}, "
                    f"which meets the SLOs for {rival.good}/{rival.requests} requests but takes longer to serve them "
                    f"(mean e2e {rival.e2e_mean_s:.3g} s vs {best.e2e_mean_s:.3g} s)")
    if best.split.layout is not Layout.COLOCATED:
        return sentence
    split = plan.best_split
    if split is not None and split is not rival:
        sentence += f"; the best prefill:decode split is {split.split.label} at {split.goodput:.3g} req/s"
    return sentence
