"""When `serve --autoplan` applies a plan: only when the best prefill:decode split beats the current one
by at least `min_gain_pct` of predicted goodput in two windows in a row (the same split both times), so
that one odd window cannot make the fleet flap between splits. Every window ends in a `Verdict`."""

from dataclasses import dataclass
from enum import StrEnum

from fleetctl.engine.planner.autoplan_settings import AutoplanSettings
from fleetctl.engine.planner.plan import Plan
from fleetctl.engine.planner.split import Split


class Decision(StrEnum):
    APPLY = "apply"  # the gain held for a second window: rebalance
    WAIT = "wait"  # the gain holds for one window: applied if the next agrees
    HOLD = "hold"  # the current split is best, or the gain is too small
    SKIP = "skip"  # nothing to judge (no traffic, a running operation, a refusal)


@dataclass(frozen=True)
class Verdict:
    decision: Decision
    reason: str
    target: Split | None = None  # set when the decision is APPLY


class AutoplanPolicy:
    def __init__(self, settings: AutoplanSettings) -> None:
        self.settings = settings
        self._candidate: Split | None = None  # the split that gained enough in the previous window

    def skip(self, reason: str) -> Verdict:
        self._candidate = None
        return Verdict(Decision.SKIP, reason)

    def judge(self, plan: Plan) -> Verdict:
        best, gain, current = plan.recommended, plan.gain_pct(), plan.current
        if gain is None or current is None:
            return self.skip("the fleet's own layout was not replayed: nothing to compare with")
        previous, self._candidate = self._candidate, None
        if best.split == current:
            return Verdict(Decision.HOLD, f"the current {current.label} is the best layout "
                                          f"({best.goodput:.3g} req/s within {plan.slo.describe()})")
        gained = f"{best.split.label} would gain {gain:.1f} % of goodput over the current {current.label}"
        if gain < self.settings.min_gain_pct:
            return Verdict(Decision.HOLD, f"{gained}, below the minimum of {self.settings.min_gain_pct:g} %")
        if previous == best.split:
            return Verdict(Decision.APPLY, f"{gained}, for the second window in a row", best.split)
        self._candidate = best.split
        return Verdict(Decision.WAIT, f"{gained}: applied if the next window agrees")
