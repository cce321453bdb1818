"""What a plan advises: move to another layout only when the replays say so beyond the cost models' error.

- **Bands.** Every layout is replayed again with the fitted costs at the ends of their error — prefill steps and
  decode steps (handoffs with decode) each × (1 ± the fit's mean relative error), the four corners — and its
  goodput's band is the lowest and highest of those replays and the fitted one.
- **Better only when the band clears.** A layout is called better than the current one only when its band's low
  end is above the current one's high end; short of that the advice is to keep the current layout, and it says by
  how much the first-ranked layout would serve more, within the error. (Elastic: a layout on fewer devices that
  serves as much, as ranked, is advised as ranked — freeing a device is not a goodput claim.)
- **Hysteresis** (the fleet's split regret, replayed every interval): once the advice named a layout to move to,
  it keeps naming it while that layout still serves more than the current one and no other layout's band clears
  its band — a layout that ranks first by less than the error does not take over, so the advice does not flip on
  one replay's noise; the sentence says since when it holds."""

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from fleetctl.engine.planner.costs import DeviceCosts
from fleetctl.engine.planner.split import Split

MIN_FACTOR = 0.1  # a cost model's low corner never goes below a tenth of its fit (a fallback is ±50 %)


class Verdict(StrEnum):
    KEEP = "keep"  # the current layout: it is best, or no layout's band clears its band
    MOVE = "move"  # to `layout`: its band clears the current one's (or did, and it still serves more)
    UNKNOWN = "unknown"  # the current layout was not replayed (a what-if fleet, a layout with every role)


@dataclass(frozen=True)
class Band:
    low: float  # goodput, requests meeting both SLOs per second
    high: float

    def clears(self, other: "Band") -> bool:
        return self.low > other.high

    def text(self) -> str:
        return f"{self.low:.3g}–{self.high:.3g} req/s"


def corners(costs: DeviceCosts) -> list[DeviceCosts]:
    """`costs` with prefill and decode each at (1 ± its fit's error): the four ends the bands are replayed at."""
    ends = [(max(MIN_FACTOR, 1 - fit.error), 1 + fit.error) for fit in (costs.prefill, costs.decode)]
    return [costs.scaled(compute, bandwidth) for compute, bandwidth in itertools.product(*ends)]


class Ranked(Protocol):
    """What advice needs of a replayed layout (planner.plan.Candidate gives it)."""

    @property
    def split(self) -> Split: ...

    @property
    def goodput(self) -> float: ...

    @property
    def band(self) -> Band: ...


@dataclass(frozen=True)
class Advice:
    verdict: Verdict
    target: Split  # the layout to run: the current one (keep) or the one to move to
    sentence: str
    since: float | None = None  # MOVE: time.time() of the replay that first advised it

    @property
    def held(self) -> tuple[Split, float] | None:
        """A move's target and since when, for the next replay's advice (hysteresis); None for keep or unknown."""
        return (self.target, self.since) if self.verdict is Verdict.MOVE and self.since is not None else None

    def as_json(self) -> dict[str, object]:
        return {"verdict": self.verdict.value, "layout": self.target.label, "sentence": self.sentence,
                "since": self.since}


def _gain(better: Ranked, current: Ranked) -> str:
    if current.goodput <= 0:
        return ("serves requests within the SLOs where it serves none" if better.goodput > 0 else
                "serves none within the SLOs either")
    return f"serves {100 * (better.goodput - current.goodput) / current.goodput:+.1f} %"


def _bands(better: Ranked, current: Ranked) -> str:
    return f"{better.band.text()} against {current.band.text()}"


def advise(ranked: Sequence[Ranked], current: Ranked | None, elastic: bool = False, held: Split | None = None,
           held_since: float | None = None, at: float | None = None) -> Advice:
    """`ranked`: the layouts best first; `current`: the fleet's layout among them (None: not replayed); `held`: the
    layout the previous advice named to move to, and since when (hysteresis); `at`: time.time() of the replay."""
    best, at = ranked[0], time.time() if at is None else at
    if current is None:
        return Advice(Verdict.UNKNOWN, best.split, f"{best.split.label} ranks first; the current layout was not "
                                                   f"replayed, so nothing says by how much")
    name = current.split.label
    kept = next((r for r in ranked if r.split == held and held != current.split), None)
    if kept is not None and kept.goodput > current.goodput and not any(
            r.band.clears(kept.band) for r in ranked if r is not kept):
        first = "" if kept is best else (f"; {best.split.label} ranks first, by less than the error "
                                         f"({best.band.text()} against {kept.band.text()})")
        since = held_since if held_since is not None else at
        clock = time.strftime("%H:%M:%S", time.gmtime(since))
        return Advice(Verdict.MOVE, kept.split, f"move to {kept.split.label} (advised since {clock} UTC): it still "
                                                f"{_gain(kept, current)} against the current {name}{first}", since)
    if best is current or best.split == current.split:
        return Advice(Verdict.KEEP, current.split, f"keep {name}: it is the best layout ({current.band.text()})")
    if elastic and best.split.devices < current.split.devices:
        return Advice(Verdict.MOVE, best.split, f"move to {best.split.label}: it serves as much as the current {name} "
                                                f"on {current.split.devices - best.split.devices} device(s) fewer "
                                                f"({_bands(best, current)})", at)
    if best.band.clears(current.band):
        return Advice(Verdict.MOVE, best.split, f"move to {best.split.label}: it {_gain(best, current)} against the "
                                                f"current {name}, beyond the error ({_bands(best, current)})", at)
    return Advice(Verdict.KEEP, current.split, f"keep {name}: {best.split.label} {_gain(best, current)}, within the "
                                               f"error ({_bands(best, current)})")
