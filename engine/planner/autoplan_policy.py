"""When `serve --autoplan` applies a plan: only when the recommended layout beats the current one by at least
`min_gain_pct` of predicted goodput — or, elastic, serves as much on fewer devices — in two windows in a row (the
same layout both times), and no sooner than `hysteresis_s` after the last change, so that one odd window cannot
make the fleet flap. Every window ends in a `Verdict`."""

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from fleetctl.engine.planner.autoplan_settings import AutoplanSettings
from fleetctl.engine.planner.plan import ENOUGH_PCT, Plan
from fleetctl.engine.planner.split import Split


class Decision(StrEnum):
    APPLY = "apply"  # the gain held for a second window: rebalance
    WAIT = "wait"  # the gain holds for one window: applied if the next agrees
    HOLD = "hold"  # the current split is best, the gain is too small, or the last change is too recent
    SKIP = "skip"  # nothing to judge (no traffic, a running operation, a refusal)


@dataclass(frozen=True)
class Verdict:
    decision: Decision
    reason: str
    target: Split | None = None  # set when the decision is APPLY


class AutoplanPolicy:
    def __init__(self, settings: AutoplanSettings, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.clock = clock
        self._candidate: Split | None = None  # the layout that gained enough in the previous window
        self._changed_at: float | None = None  # when the last applied change began

    def skip(self, reason: str) -> Verdict:
        self._candidate = None
        return Verdict(Decision.SKIP, reason)

    def applied(self) -> None:
        """The last APPLY's rebalance began: the hysteresis window starts now."""
        self._changed_at = self.clock()

    def judge(self, plan: Plan) -> Verdict:
        best, gain, current = plan.recommended, plan.gain_pct(), plan.current
        if gain is None or current is None:
            return self.skip("the fleet's own layout was not replayed: nothing to compare with")
        previous, self._candidate = self._candidate, None
        if best.split == current:
            return Verdict(Decision.HOLD, f"the current {current.label} is the best layout "
                                          f"({best.goodput:.3g} req/s within {plan.slo.describe()})")
        if best.split.devices < current.devices:
            gained = (f"{best.split.label} would serve as much as the current {current.label} (within "
                      f"{ENOUGH_PCT:g} %) on {current.devices - best.split.devices} device(s) fewer")
        else:
            gained = f"{best.split.label} would gain {gain:.1f} % of goodput over the current {current.label}"
            if gain < self.settings.min_gain_pct:
                return Verdict(Decision.HOLD, f"{gained}, below the minimum of {self.settings.min_gain_pct:g} %")
        since = None if self._changed_at is None else self.clock() - self._changed_at
        if since is not None and since < self.settings.hysteresis_s:
            self._candidate = best.split  # still counts as the first window once the hysteresis is over
            return Verdict(Decision.HOLD, f"{gained}, but the layout changed {since:.0f} s ago: the next change "
                                          f"waits out the {self.settings.hysteresis_s:g} s hysteresis")
        if previous == best.split:
            return Verdict(Decision.APPLY, f"{gained}, for the second window in a row", best.split)
        self._candidate = best.split
        return Verdict(Decision.WAIT, f"{gained}: applied if the next window agrees")
