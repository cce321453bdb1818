"""Per-device cost models fitted to the store's measured steps (`store.plan_inputs`):

- prefill: step seconds = a + b · tokens + c · Σ tokens² (the last for causal attention), wall time from
  the step's start to its first tokens at the controller;
- decode: step seconds = a + b · batch + c · context (tokens of KV the step reads, summed over its
  sequences), the time per output token a client sees;
- handoff: seconds = a + b · bytes, and the bytes a prompt token's KV takes.

All the
devices of one kind (CPU slots, or GPUs) share one model: on one machine they are the same hardware.
A what-if fleet scales the model by peak ratios (`scaled`).

A window with too few whole steps of a phase to fit (a handful of requests, or a phase that hardly ran)
falls back to the workers' own samples: the seconds they spent stepping over the tokens (prefill) or steps
(decode) of that phase — its FLOPs (bytes) over the device's peak at the MFU (MBU) seen so far. That model
is proportional only, so its error is taken as wide (`FALLBACK_ERROR`) and the plan says so."""

from collections.abc import Sequence
from dataclasses import dataclass

from fleetctl.domain import DeviceKind
from fleetctl.engine.planner.fit import FitError, LinearFit, fit_nonnegative
from fleetctl.store.plan_inputs import Peaks, PhaseBusy, PlanInputs

MIN_HANDOFFS = 3
FALLBACK_ERROR = 0.5  # the relative error a model costed from stepping time (not fitted to steps) is taken to have
PREFILL_TERMS, DECODE_TERMS = ("1", "tokens", "tokens²"), ("1", "batch", "context")


@dataclass(frozen=True)
class Fallback:
    """A phase costed from its workers' stepping time because the window held too few of its steps to fit."""

    phase: str  # "prefill" or "decode"
    note: str  # the sentence for the plan's notes: why, and the rate used


@dataclass(frozen=True)
class DeviceCosts:
    kind: DeviceKind
    prefill: LinearFit  # over ("1", "tokens", "tokens²")
    decode: LinearFit  # over ("1", "batch", "context")
    handoff: LinearFit | None  # over ("1", "bytes"); None when no handoff was measured (then free)
    bytes_per_token: float  # KV handed over per prompt token
    peaks: Peaks | None  # of the measured devices
    fallbacks: tuple[Fallback, ...] = ()

    def prefill_s(self, prompts: Sequence[int]) -> float:
        return self.prefill.predict(1.0, sum(prompts), sum(p * p for p in prompts))

    def decode_s(self, batch: int, context: int) -> float:
        return self.decode.predict(1.0, batch, context)

    def handoff_s(self, prompt_tokens: int) -> float:
        return self.handoff.predict(1.0, prompt_tokens * self.bytes_per_token) if self.handoff else 0.0

    def scaled(self, compute: float, bandwidth: float) -> "DeviceCosts":
        """Every prefill time × `compute`, every decode and handoff time × `bandwidth`."""
        handoff = self.handoff.scaled(bandwidth) if self.handoff else None
        return DeviceCosts(self.kind, self.prefill.scaled(compute), self.decode.scaled(bandwidth), handoff,
                           self.bytes_per_token, self.peaks, self.fallbacks)

    def as_json(self) -> dict[str, object]:
        return {"device_kind": self.kind.value, "prefill": self.prefill.as_json(), "decode": self.decode.as_json(),
                "handoff": self.handoff.as_json() if self.handoff else None,
                "handoff_bytes_per_token": round(self.bytes_per_token, 1)}


def measured_kinds(inputs: PlanInputs) -> list[DeviceKind]:
    """Device kinds with prefill or decode measurements, the most measured first."""
    counts: dict[DeviceKind, int] = {}
    for point in (*inputs.prefill_steps, *inputs.decode_runs):
        counts[point.kind] = counts.get(point.kind, 0) + 1
    return sorted(counts, key=lambda kind: -counts[kind])


def fit_costs(inputs: PlanInputs, kind: DeviceKind) -> DeviceCosts:
    """Raises FitError when the window holds too few prefill steps or decode seconds on `kind` and its workers'
    samples show no stepping time of that phase either."""
    busy = inputs.busy.get(kind, PhaseBusy())
    fallbacks: list[Fallback] = []
    steps = [s for s in inputs.prefill_steps if s.kind is kind]
    prefill = _fit_or_fall_back(
        PREFILL_TERMS, [(1.0, s.tokens, s.squares) for s in steps], [s.seconds for s in steps], None,
        "prefill", f"prefill model ({kind.value} prefill steps)", busy.prefill_s, busy.prefill_tokens, 1,
        "prompt token", fallbacks)
    runs = [d for d in inputs.decode_runs if d.kind is kind]
    decode = _fit_or_fall_back(
        DECODE_TERMS, [(1.0, d.batch, d.context) for d in runs], [d.seconds_per_step for d in runs],
        [d.steps for d in runs], "decode", f"decode model ({kind.value} requests' decodes)", busy.decode_s,
        busy.decode_steps, 0, "decode step", fallbacks)
    handoffs = [h for h in inputs.handoffs if h.kind is kind and h.seconds > 0]
    handoff, per_token = None, 0.0
    if len(handoffs) >= MIN_HANDOFFS:
        handoff = fit_nonnegative(("1", "bytes"), [(1.0, h.bytes) for h in handoffs], [h.seconds for h in handoffs],
                                  what="handoff model")
        per_token = sum(h.bytes for h in handoffs) / sum(h.prompt_tokens for h in handoffs)
    return DeviceCosts(kind, prefill, decode, handoff, per_token, inputs.peaks.get(kind), tuple(fallbacks))


def _fit_or_fall_back(terms: tuple[str, ...], x: list[tuple[float, ...]], y: list[float], counts: list[float] | None,
                      phase: str, what: str, busy_s: float, units: int, term: int, unit: str,
                      fallbacks: list[Fallback]) -> LinearFit:
    """The fit of y over x; with too few points, busy_s / units as the coefficient of `terms[term]` (the others 0),
    and a Fallback that says so appended to `fallbacks`."""
    try:
        return fit_nonnegative(terms, x, y, counts, what=what)
    except FitError as error:
        if units <= 0:
            raise FitError(f"{error}, and the window's samples show no time spent in such steps either") from None
        per_unit = busy_s / units
        fallbacks.append(Fallback(phase, f"{error}: costed instead from the workers' stepping time, "
                                         f"{per_unit * 1e3:.3g} ms per {unit} (FLOPs or bytes over the peak at the "
                                         f"utilization seen), taken as ±{FALLBACK_ERROR:.0%} off"))
        coefficients = tuple(per_unit if i == term else 0.0 for i in range(len(terms)))
        return LinearFit(terms, coefficients, len(y), FALLBACK_ERROR)
