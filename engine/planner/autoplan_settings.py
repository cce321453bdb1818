"""What `serve --autoplan` is configured with: a field of FleetConfig, kept apart from the policy so that
loading a fleet's configuration does not load the planner."""

from dataclasses import dataclass, field
from typing import Annotated

from fleetctl.engine.planner.slo import SLO_PAIR, Slo
from fleetctl.errors import UserError
from fleetctl.options import ZERO_IS_NONE, CliOption


@dataclass(frozen=True)
class AutoplanSettings:
    interval_s: Annotated[float, CliOption(  # one plan per interval, over the interval just past
        "--autoplan-interval", min=1.0, help="Seconds per autoplan window.")] = 60.0
    min_gain_pct: Annotated[float, CliOption(
        "--min-gain", min=0.0, help="Predicted goodput gain (%) autoplan needs, two windows in a row.")] = 10.0
    slo: Annotated[Slo, CliOption(
        "--autoplan-slo", convert=SLO_PAIR, help="TTFT,TPOT objectives autoplan's goodput counts against.")] = field(
        default_factory=Slo)
    # elastic: plan over up to this many of the fleet's devices (`--devices` lists the free ones), starting workers
    # on free devices and stopping idle ones; None keeps the fleet's worker count
    max_workers: Annotated[int | None, CliOption(
        "--max-workers", convert=ZERO_IS_NONE, min=0,
        help="Autoplan may grow the fleet to N workers on the free devices of --devices and shrink it (stopping idle "
             "workers); 0 keeps the worker count.")] = None
    # after a change, the next waits this long: one odd window cannot make the fleet flap
    hysteresis_s: Annotated[float, CliOption(
        "--autoplan-hysteresis", min=0.0, help="Seconds autoplan waits after a change before the next.")] = 300.0

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise UserError("the autoplan interval must be positive")
        if self.min_gain_pct < 0:
            raise UserError("the autoplan's minimum gain must be >= 0 %")
        if self.hysteresis_s < 0:
            raise UserError("the autoplan's hysteresis must be >= 0 s")
        if self.max_workers is not None and self.max_workers < 1:
            raise UserError("--max-workers must be >= 1")
