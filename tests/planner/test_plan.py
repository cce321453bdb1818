"""`plan` on store fixture data (tests/support/synthetic_fleet.py: what a 1 prefill + 1 decode fleet with known
step costs writes): the fit recovers the costs, rag-like traffic gets more prefill workers than agent-like
traffic on the same devices, the JSON has DESIGN's shape, a what-if fleet is scaled by published peaks,
and bad input is refused with one line."""

from dataclasses import replace
from pathlib import Path

import pytest
from support.synthetic_fleet import T0, TrueCosts, workload, write_store

from fleetctl.engine.metrics.gpu_specs import find_gpu_spec
from fleetctl.engine.planner.durations import parse_latency, parse_window
from fleetctl.engine.planner.plan import (
    ENOUGH_PCT,
    Candidate,
    Plan,
    PlanRequest,
    explain,
    make_plan,
    plan_from_store,
    rank,
)
from fleetctl.engine.planner.plan_devices import parse_devices
from fleetctl.engine.planner.simulator import SimRequest
from fleetctl.engine.planner.slo import Slo
from fleetctl.engine.planner.split import Split, parse_split, splits_up_to
from fleetctl.errors import UserError
from fleetctl.store.db import open_db
from fleetctl.store.plan_inputs import plan_inputs

THREE = "cpu:0,cpu:1,cpu:2"
WINDOW = 3600.0


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, float]]:
    """The same fleet measured under rag-like and under agent-like traffic."""
    root = tmp_path_factory.mktemp("plan-stores")
    return {kind: (root / f"{kind}.db", write_store(root / f"{kind}.db", workload(kind, 60, rate)))
            for kind, rate in (("rag", 1.5), ("agent", 2.0))}


def plan_of(stores: dict, kind: str, devices: str | None = THREE, **request: object) -> Plan:
    path, now = stores[kind]
    return plan_from_store(path, WINDOW, PlanRequest(devices=devices, **request), now=now)


def test_the_fit_recovers_the_fleets_step_costs(stores: dict) -> None:
    truth = TrueCosts()
    plan = plan_of(stores, "agent")
    assert plan.costs.prefill.coefficients == pytest.approx(truth.prefill, rel=1e-3)
    assert plan.costs.handoff is not None and plan.costs.handoff.coefficients == pytest.approx(truth.handoff)
    assert plan.costs.bytes_per_token == truth.kv_bytes_per_token
    decode = plan.costs.decode
    assert decode.error < 0.05 and decode.points >= 30
    for batch, context in ((1, 200), (16, 16 * 300), (40, 40 * 250)):  # the decode steps the agent trace ran
        assert plan.costs.decode_s(batch, context) == pytest.approx(truth.decode_s(batch, context), rel=0.1)


def test_rag_traffic_gets_more_prefill_workers_than_agent_traffic(stores: dict) -> None:
    rag, agent = plan_of(stores, "rag"), plan_of(stores, "agent")
    assert rag.best_split is not None and agent.best_split is not None
    assert (rag.best_split.split, agent.best_split.split) == (Split(2, 1), Split(1, 2))
    by_split = {c.split: c for c in rag.candidates}
    assert by_split[Split(2, 1)].goodput > 1.5 * by_split[Split(1, 2)].goodput
    assert by_split[Split(1, 2)].ttft_p90_s > 2.0  # one prefill worker cannot keep up with the long prompts
    assert {c.split for c in rag.candidates} == {Split(1, 2), Split(2, 1), Split(mixed=3)}


def test_plan_json_has_designs_shape_and_a_reason_with_numbers(stores: dict) -> None:
    plan = plan_of(stores, "rag")
    body = plan.as_json()
    assert list(body)[:4] == ["recommended", "current", "candidates", "reason"]
    assert body["current"] == {"prefill": 1, "decode": 1, "mixed": 0, "layout": "disaggregated",
                              "devices": 2}
    assert set(body["candidates"][0]) >= {"prefill", "decode", "goodput", "ttft_p90_s", "tpot_p90_s"}
    assert body["recommended"] == {k: body["candidates"][0][k] for k in ("prefill", "decode", "mixed", "layout",
                                                                          "devices")}
    goodputs = [c["goodput"] for c in body["candidates"]]
    assert goodputs == sorted(goodputs, reverse=True)
    best = plan.recommended
    assert f"{best.goodput:.3g} req/s ({best.good}/{best.requests} requests)" in body["reason"]
    assert body["reason"].startswith(f"{best.split.label} is best")
    assert body["fit"]["prefill"]["points"] == 60 and body["source"] == "store" and body["what_if"] is None
    assert body["gain_pct"] is None  # the fleet's own devices are two, the plan's three: no current candidate


def test_the_current_layout_and_gain_on_the_fleets_own_devices(stores: dict) -> None:
    plan = plan_of(stores, "agent", devices=None)
    assert plan.devices.names == ("cpu:0", "cpu:1") and plan.current == Split(1, 1)
    assert {c.split for c in plan.candidates} == {Split(1, 1), Split(mixed=2)}
    current = plan.candidate(Split(1, 1))
    best = plan.recommended  # what the gain is of: colocated included, since rebalance reaches it live
    assert current is not None and plan.gain_pct() == pytest.approx(100 * (best.goodput - current.goodput)
                                                                    / current.goodput)


def test_a_trace_replaces_the_windows_requests(stores: dict) -> None:
    trace = tuple(SimRequest(i * 0.5, 100, 20) for i in range(10))
    plan = plan_of(stores, "rag", trace=trace)
    assert plan.source == "trace" and plan.recommended.requests == 10


def test_a_what_if_fleet_scales_prefill_by_flops_and_decode_by_bandwidth(stores: dict) -> None:
    measured = plan_of(stores, "agent")
    h100 = plan_of(stores, "agent", devices="8xH100")
    spec = find_gpu_spec("H100")
    assert spec is not None and h100.devices.gpu == spec and len(h100.devices.names) == 8
    assert h100.costs.prefill_s([1000]) == pytest.approx(measured.costs.prefill_s([1000]) * 1e12 / spec.tensor_flops)
    assert h100.costs.decode_s(8, 4000) == pytest.approx(measured.costs.decode_s(8, 4000) * 1e11 / spec.bytes_per_s)
    assert len(h100.candidates) == 8 and h100.candidate(h100.current) is None
    assert "what-if 8x H100" in h100.notes[0] and "same fraction of their peaks" in h100.notes[0]
    assert h100.as_json()["what_if"] == {"gpu": "H100", "count": 8}


def test_an_empty_window_or_unmeasured_devices_are_refused(stores: dict) -> None:
    path, now = stores["rag"]
    with pytest.raises(UserError, match=r"^no requests to replay: the last 10m of the store hold none"):
        plan_from_store(path, 600, PlanRequest(), now=now + 7200)
    with pytest.raises(UserError, match="the window has no cuda measurements to cost cuda:0,cuda:1"):
        plan_of(stores, "rag", devices="cuda:0,cuda:1")
    with pytest.raises(UserError, match=r"^no metrics store at"):
        plan_from_store(path.parent / "none.db", 600, PlanRequest())
    db = open_db(path)
    inputs = plan_inputs(db, WINDOW, now)
    db.close()
    with pytest.raises(UserError, match="the store shows no worker serving the window's requests"):
        make_plan(inputs, PlanRequest(), workers=[])


@pytest.mark.parametrize(("text", "message"), [
    ("8xFOO", r"unknown GPU 'FOO' in --devices '8xFOO': the spec table knows H100 NVL, "),
    ("0xH100", "a plan takes 1 to 64 devices, not 0"),
    ("tpu:0", r"unknown device 'tpu:0': use cpu:N or cuda:N.* \(or NxGPU for a what-if fleet"),
    ("cpu:0,cpu:0", "names a device twice"),
    ("cpu:0,cuda:1", "mixes CPU slots and GPUs"),
    (",", "bad --devices ','"),
])
def test_bad_device_specs_get_one_line(text: str, message: str) -> None:
    with pytest.raises(UserError, match=message) as error:
        parse_devices(text)
    assert "\n" not in str(error.value)


def test_durations_and_splits_parse_or_say_how() -> None:
    assert [parse_latency(t) for t in ("2s", "200ms", "0.2", " 1.5 s", ".5")] == pytest.approx([2, 0.2, 0.2, 1.5, 0.5])
    assert [parse_window(t) for t in ("90s", "10m", "2h", "1d", "30")] == [90, 600, 7200, 86400, 30]
    for bad in ("2x", "", "-1s", "0ms", "1e3"):
        with pytest.raises(UserError, match=r"bad --slo-ttft .*: use e.g. 2s, 200ms or 0.2"):
            parse_latency(bad, "--slo-ttft")
    assert parse_split(" 2 : 1 ") == Split(2, 1)
    for bad, message in (("2-1", "bad split '2-1': use PREFILL:DECODE"), ("0:3", "leaves a role empty")):
        with pytest.raises(UserError, match=message):
            parse_split(bad)


def test_the_store_fixture_is_what_a_fleet_writes(stores: dict) -> None:
    """The fixture goes through the real aggregator and writer: the window has rows of both workers."""
    path, now = stores["rag"]
    db = open_db(path)
    inputs = plan_inputs(db, WINDOW, now)
    assert {w.worker_id for w in inputs.workers} == {"prefill-0", "decode-0"}
    assert len(inputs.requests) == 60 and inputs.requests[0].arrival_s == 0.0
    assert db.execute("SELECT MIN(ts) FROM requests").fetchone()[0] == pytest.approx(T0)


def test_a_tie_in_goodput_and_headroom_keeps_the_current_layout(stores: dict) -> None:
    """Measured on smollm2 agent traffic: 1:2 and colocated served the same goodput, TPOT p90 equal (the
    headroom), TTFT p90 1.097 s vs 1.077 s; the label used to pick 1:2 and call it 'more headroom'."""
    slo = Slo(10.0, 0.3)
    split = Candidate(Split(1, 2), 20, 20, 0.208, 1.097, 0.0794, 20.0)
    colocated = Candidate(Split(mixed=3), 20, 20, 0.208, 1.077, 0.0794, 20.0)
    worse = Candidate(Split(2, 1), 20, 20, 0.208, 1.077, 0.121, 20.0)
    assert rank([split, worse, colocated], slo, Split(mixed=3)) == [colocated, split, worse]
    assert rank([split, worse, colocated], slo, Split(2, 1)) == [split, colocated, worse]
    plan = replace(plan_of(stores, "agent"), slo=slo, current=Split(mixed=3), candidates=[colocated, split, worse])
    reason = explain(plan)
    assert reason.startswith("the current colocated 3 is already best") and "as much headroom" in reason, reason


def test_a_window_with_too_few_steps_to_fit_is_costed_from_stepping_time(tmp_path: Path) -> None:
    """Two requests: two prefill steps and two decodes, too few to fit either model (3 points each). The plan
    still answers, from the seconds the workers' samples spent stepping, and says its numbers are rough."""
    requests = workload("agent", 2, 2.0)
    now = write_store(tmp_path / "two.db", requests)
    plan = plan_from_store(tmp_path / "two.db", WINDOW, PlanRequest(devices=THREE), now=now)
    truth, prompts = TrueCosts(), [prompt for _, prompt, _ in requests]
    assert [f.phase for f in plan.costs.fallbacks] == ["prefill", "decode"]
    prefill, decode = plan.costs.prefill, plan.costs.decode
    assert (prefill.coefficients[0], prefill.coefficients[2], prefill.error) == (0.0, 0.0, 0.5)
    assert prefill.points == 2
    # the prefill worker's intervals hold only its two steps: their stepping time, to the bit of a rounding
    assert prefill.coefficients[1] * sum(prompts) == pytest.approx(sum(map(truth.prefill_s, prompts)), rel=1e-6)
    longest = max(prompt + out for _, prompt, out in requests)
    assert decode.coefficients[1:] == (0.0, 0.0)
    assert truth.decode_s(1, min(prompts)) <= decode.coefficients[0] <= truth.decode_s(2, 2 * longest)
    assert any("need 3: costed instead from the workers' stepping time" in note for note in plan.notes)
    assert plan.reason.endswith("(rough: too few prefill and decode steps in the window to fit, so they are "
                                "costed from the workers' stepping time)")
    assert plan.as_json()["fit"]["prefill"]["error"] == 0.5


def test_an_elastic_plan_ranks_every_count_of_devices_and_takes_the_fewest_that_serve_enough(stores: dict) -> None:
    plan = plan_of(stores, "agent", elastic=True)
    assert sorted(c.split for c in plan.candidates) == sorted(splits_up_to(3))
    best, top = plan.recommended, max(plan.candidates, key=lambda c: c.rounded_goodput)
    assert best.rounded_goodput >= top.rounded_goodput * (1 - ENOUGH_PCT / 100)
    enough = [c for c in plan.candidates if c.rounded_goodput >= top.rounded_goodput * (1 - ENOUGH_PCT / 100)]
    assert best.split.devices == min(c.split.devices for c in enough) < 3
    assert plan.as_json()["elastic"] is True and plan.as_json()["recommended"]["devices"] == best.split.devices
    assert {c.split.devices for c in plan_of(stores, "agent").candidates} == {3}  # not elastic: all three


def test_where_no_layout_meets_the_slos_the_closest_wins_however_many_devices_it_takes() -> None:
    slo = Slo(1.0, 0.1)
    close = Candidate(Split(2, 2), 10, 0, 0.0, 1.5, 0.1, 3.0)  # worse p90 1.5x its SLO
    small = Candidate(Split(mixed=1), 10, 0, 0.0, 9.0, 0.5, 9.0)  # 9x
    assert rank([small, close], slo, None, elastic=True) == [close, small]
