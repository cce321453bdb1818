"""Autoplan's decisions, window by window: it applies only when the same split gains enough in two windows in
a row, and any window that does not (a hold, a skip, another split) starts the count again."""

from pathlib import Path

import pytest
from support.fleet_harness import fleetctl

from fleetctl.engine.planner.autoplan_policy import AutoplanPolicy, Decision
from fleetctl.engine.planner.autoplan_settings import AutoplanSettings
from fleetctl.engine.planner.costs import DeviceCosts
from fleetctl.engine.planner.fit import LinearFit
from fleetctl.engine.planner.plan import Candidate, Plan
from fleetctl.engine.planner.plan_devices import parse_devices
from fleetctl.engine.planner.slo import Slo
from fleetctl.engine.planner.split import Split
from fleetctl.errors import UserError

CURRENT = Split(1, 2)
COSTS = DeviceCosts(kind=parse_devices("cpu:0").kind, prefill=LinearFit(("1",), (1.0,), 3, 0.0),
                    decode=LinearFit(("1",), (0.1,), 3, 0.0), handoff=None, bytes_per_token=0.0, peaks=None)


def window(goodputs: dict[Split, float], current: Split | None = CURRENT) -> Plan:
    candidates = sorted((Candidate(s, 40, round(g * 40), g, 1.0, 0.1, 2.0) for s, g in goodputs.items()),
                        key=lambda c: -c.goodput)
    return Plan(60.0, "store", Slo(), parse_devices("cpu:0,cpu:1,cpu:2"), COSTS, current, candidates, [])


RAG = {Split(2, 1): 1.0, Split(1, 2): 0.5, Split(mixed=3): 0.9}  # 2:1 gains 100 %
SLIGHT = {Split(2, 1): 0.52, Split(1, 2): 0.5, Split(mixed=3): 0.4}  # 2:1 gains 4 %
BALANCED = {Split(1, 2): 0.8, Split(2, 1): 0.5, Split(mixed=3): 0.6}


def test_applies_when_the_gain_holds_for_two_windows() -> None:
    policy = AutoplanPolicy(AutoplanSettings(min_gain_pct=10))
    first = policy.judge(window(RAG))
    assert first.decision is Decision.WAIT and first.target is None
    assert first.reason == "2:1 would gain 100.0 % of goodput over the current 1:2: applied if the next window agrees"
    second = policy.judge(window(RAG))
    assert second.decision is Decision.APPLY and second.target == Split(2, 1)
    assert second.reason.endswith("for the second window in a row")
    assert policy.judge(window(RAG)).decision is Decision.WAIT  # a new count after an apply


@pytest.mark.parametrize("between", ["slight", "balanced", "skip", "other split"])
def test_anything_else_between_two_good_windows_starts_again(between: str) -> None:
    policy = AutoplanPolicy(AutoplanSettings(min_gain_pct=10))
    assert policy.judge(window(RAG)).decision is Decision.WAIT
    if between == "slight":
        verdict = policy.judge(window(SLIGHT))
        assert verdict.decision is Decision.HOLD
        assert "gain 4.0 %" in verdict.reason and "minimum of 10 %" in verdict.reason
    elif between == "balanced":
        verdict = policy.judge(window(BALANCED))
        assert verdict.decision is Decision.HOLD and verdict.reason.startswith("the current 1:2 is the best layout")
    elif between == "skip":
        assert policy.skip("no requests").decision is Decision.SKIP
    else:  # a different split wins the window between
        other = {Split(3, 1): 1.0, Split(1, 2): 0.5}
        assert policy.judge(window(other)).decision is Decision.WAIT
    assert policy.judge(window(RAG)).decision is Decision.WAIT


def test_a_plan_without_the_current_layout_is_skipped() -> None:
    policy = AutoplanPolicy(AutoplanSettings())
    verdict = policy.judge(window({Split(2, 1): 1.0, Split(1, 2): 0.5}, current=None))
    assert verdict.decision is Decision.SKIP


def test_settings_are_checked() -> None:
    with pytest.raises(UserError, match="interval must be positive"):
        AutoplanSettings(interval_s=0)
    with pytest.raises(UserError, match="minimum gain must be >= 0"):
        AutoplanSettings(min_gain_pct=-1)


def test_serve_refuses_autoplan_it_cannot_run(tiny_model_dir: Path) -> None:
    """No worker starts: the configuration is refused first (one line, exit 1)."""
    bad_slo = fleetctl("serve", "--model", str(tiny_model_dir), "--autoplan", "--autoplan-slo", "2s", "--port", "0")
    assert bad_slo.returncode == 1
    assert bad_slo.stderr == "fleetctl: error: bad --autoplan-slo '2s': use TTFT,TPOT, e.g. 2s,200ms\n"
    assert Slo.parse_pair("1s, 50ms") == Slo(1.0, 0.05)
    alone = fleetctl("serve", "--model", str(tiny_model_dir), "--max-workers", "3", "--port", "0")
    assert (alone.returncode, alone.stderr) == (1, "fleetctl: error: --max-workers sets how far --autoplan may grow "
                                                   "the fleet: give --autoplan with it\n")
    beyond = fleetctl("serve", "--model", str(tiny_model_dir), "--autoplan", "--max-workers", "4", "--devices",
                      "cpu:0,cpu:1,cpu:2", "--port", "0")
    assert (beyond.returncode, beyond.stderr) == (1, "fleetctl: error: --max-workers 4 must be between the fleet's 2 "
                                                     "workers and the 3 devices of --devices (cpu:0, cpu:1, cpu:2)\n")


def ranked(goodputs: dict[Split, float], current: Split) -> Plan:
    """A plan whose candidates come in the order given (an elastic plan puts the fewest devices that serve
    enough first)."""
    candidates = [Candidate(s, 40, round(g * 40), g, 1.0, 0.1, 2.0) for s, g in goodputs.items()]
    return Plan(60.0, "store", Slo(), parse_devices("cpu:0,cpu:1,cpu:2"), COSTS, current, candidates, [], True)


def test_an_elastic_fleet_shrinks_as_it_grows_and_waits_out_the_hysteresis_between() -> None:
    now = [0.0]
    policy = AutoplanPolicy(AutoplanSettings(min_gain_pct=10, hysteresis_s=300), clock=lambda: now[0])
    quiet = ranked({Split(mixed=2): 0.99, Split(1, 2): 1.0}, current=Split(1, 2))  # as much on one device fewer
    first = policy.judge(quiet)
    assert first.decision is Decision.WAIT
    assert first.reason == ("colocated 2 would serve as much as the current 1:2 (within 5 %) on 1 device(s) fewer: "
                            "applied if the next window agrees")
    assert policy.judge(quiet).target == Split(mixed=2)
    policy.applied()
    busy = ranked({Split(1, 2): 2.0, Split(mixed=2): 1.0}, current=Split(mixed=2))
    for at in (60.0, 120.0, 240.0):
        now[0] = at
        held = policy.judge(busy)
        assert held.decision is Decision.HOLD and held.reason == (
            f"1:2 would gain 100.0 % of goodput over the current colocated 2, but the layout changed {at:.0f} s ago: "
            f"the next change waits out the 300 s hysteresis")
    now[0] = 300.0
    assert policy.judge(busy).decision is Decision.APPLY  # the held windows agreed: no further wait
    assert policy.judge(ranked({Split(mixed=2): 0.9, Split(1, 2): 1.0}, Split(1, 2))).decision is Decision.WAIT
