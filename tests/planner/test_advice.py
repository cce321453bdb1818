"""The plan's advice: a layout is called better only when its goodput band clears the current one's; a move once
advised holds while that layout still serves more and no band clears its own (hysteresis); the bands come from
replays at the cost models' error ends."""

import pytest
from support.synthetic_fleet import workload, write_store

from fleetctl.domain import DeviceKind
from fleetctl.engine.planner.advice import Verdict, advise, corners
from fleetctl.engine.planner.costs import DeviceCosts
from fleetctl.engine.planner.fit import LinearFit
from fleetctl.engine.planner.plan import Candidate, PlanRequest, plan_from_store
from fleetctl.engine.planner.split import Split

AT = 1_000_000.0  # 13:46:40 UTC


def layout(split: Split, goodput: float, low: float, high: float) -> Candidate:
    return Candidate(split, 40, round(goodput * 40), goodput, 1.0, 0.1, 2.0, (low, high))


CURRENT = layout(Split(1, 1), 1.00, 0.90, 1.10)
CLEARS = layout(Split(mixed=2), 1.30, 1.15, 1.45)  # its low end above the current one's high end
NOISE = layout(Split(mixed=2), 1.06, 0.95, 1.17)  # ranks first, inside the current one's band


def test_a_layout_is_better_only_when_its_band_clears_the_current_ones() -> None:
    move = advise([CLEARS, CURRENT], CURRENT, at=AT)
    assert (move.verdict, move.target, move.since) == (Verdict.MOVE, Split(mixed=2), AT)
    assert move.sentence == ("move to colocated 2: it serves +30.0 % against the current 1:1, beyond the error "
                             "(1.15–1.45 req/s against 0.9–1.1 req/s)")
    keep = advise([NOISE, CURRENT], CURRENT, at=AT)
    assert (keep.verdict, keep.target, keep.since) == (Verdict.KEEP, Split(1, 1), None)
    assert keep.sentence == ("keep 1:1: colocated 2 serves +6.0 %, within the error (0.95–1.17 req/s against "
                             "0.9–1.1 req/s)")
    best = advise([CURRENT, NOISE], CURRENT, at=AT)
    assert best.verdict is Verdict.KEEP and best.sentence == "keep 1:1: it is the best layout (0.9–1.1 req/s)"
    unknown = advise([NOISE, CURRENT], None, at=AT)
    assert unknown.verdict is Verdict.UNKNOWN and unknown.target == Split(mixed=2)


def test_a_move_once_advised_holds_until_the_evidence_says_otherwise() -> None:
    rival = layout(Split(2, 1), 1.35, 1.20, 1.50)  # first, but inside the held layout's band
    held = advise([rival, CLEARS, CURRENT], CURRENT, held=Split(mixed=2), held_since=AT - 60, at=AT)
    assert (held.verdict, held.target, held.since) == (Verdict.MOVE, Split(mixed=2), AT - 60)
    assert held.sentence.startswith("move to colocated 2 (advised since 13:45:40 UTC): it still serves +30.0 % "
                                    "against the current 1:1; 2:1 ranks first, by less than the error")
    clear_winner = layout(Split(2, 1), 1.80, 1.60, 2.00)  # its band clears the held layout's: it takes over
    taken = advise([clear_winner, CLEARS, CURRENT], CURRENT, held=Split(mixed=2), held_since=AT - 60, at=AT)
    assert (taken.verdict, taken.target, taken.since) == (Verdict.MOVE, Split(2, 1), AT)
    faded = layout(Split(mixed=2), 0.98, 0.88, 1.08)  # the held layout no longer serves more: keep
    dropped = advise([CURRENT, faded], CURRENT, held=Split(mixed=2), held_since=AT - 60, at=AT)
    assert dropped.verdict is Verdict.KEEP and dropped.target == Split(1, 1)
    without = advise([NOISE, CURRENT], CURRENT, at=AT)  # the same replay with nothing held: keep
    assert without.verdict is Verdict.KEEP


def test_the_bands_are_replays_at_the_cost_models_error_ends(tmp_path) -> None:
    fit = LinearFit(("1", "tokens", "tokens²"), (0.1, 0.01, 0.0), 10, 0.2)
    costs = DeviceCosts(DeviceKind.CPU, fit, LinearFit(("1", "batch", "context"), (0.05, 0.0, 0.0), 10, 0.5),
                        None, 0.0, None)
    ends = {(round(c.prefill.coefficients[0], 3), round(c.decode.coefficients[0], 4)) for c in corners(costs)}
    assert ends == {(0.08, 0.025), (0.08, 0.075), (0.12, 0.025), (0.12, 0.075)}
    now = write_store(tmp_path / "two.db", workload("agent", 2, 2.0))  # too few steps: costed at ±50 %
    plan = plan_from_store(tmp_path / "two.db", 3600.0, PlanRequest(devices="cpu:0,cpu:1"), now=now)
    assert plan.costs.fallbacks and plan.advice is not None
    widest = max(c.band.high - c.band.low for c in plan.candidates)
    assert widest > 0 and all(c.band.low <= c.goodput <= c.band.high for c in plan.candidates)
    assert plan.as_json()["candidates"][0]["goodput_band"] == pytest.approx(
        [plan.recommended.band.low, plan.recommended.band.high], abs=1e-4)
