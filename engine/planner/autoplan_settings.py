"""What `serve --autoplan` is configured with: a field of FleetConfig, kept apart from the policy so that
loading a fleet's configuration does not load the planner."""

from dataclasses import dataclass, field

from fleetctl.engine.planner.slo import Slo
from fleetctl.errors import UserError


@dataclass(frozen=True)
class AutoplanSettings:
    interval_s: float = 60.0  # one plan per interval, over the interval just past
    min_gain_pct: float = 10.0
    slo: Slo = field(default_factory=Slo)
    # elastic: plan over up to this many of the fleet's devices (`--devices` lists the free ones), starting workers
    # on free devices and stopping idle ones; None keeps the fleet's worker count
    max_workers: int | None = None
    hysteresis_s: float = 300.0  # after a change, the next waits this long: one odd window cannot make the fleet flap

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise UserError("the autoplan interval must be positive")
        if self.min_gain_pct < 0:
            raise UserError("the autoplan's minimum gain must be >= 0 %")
        if self.hysteresis_s < 0:
            raise UserError("the autoplan's hysteresis must be >= 0 s")
        if self.max_workers is not None and self.max_workers < 1:
            raise UserError("--max-workers must be >= 1")
