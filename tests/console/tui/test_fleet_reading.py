"""What the console draws from a reading: charts end at the last bucket the store has settled, and a worker's
tokens/s is the fleet's live rate, not the store's newest bucket; a pool's lines in the form that fits."""

from support.console_fixture import HISTORY, STATUS, worker

from fleetctl.console.tui.reading import FleetReading
from fleetctl.console.tui.widgets.panels import event_line
from fleetctl.console.tui.widgets.pools import REGRET_LABEL_W, flow_line, regret_label, structured_line, tier_line
from fleetctl.engine.api.history import EventRecord, FleetHistory
from fleetctl.engine.api.status import FlowInfo, SplitRegretInfo, TierInfo


def point(ts: float, busy: float, tokens_per_s: float) -> dict:
    return {"ts": ts, "busy": busy, "mfu": busy / 2, "mbu": busy / 4, "tokens_per_s": tokens_per_s}


# the store's shape a few seconds into a bucket: the one holding now has no samples yet
SERIES = [point(990.0, 0.9, 120.0), point(995.0, 0.95, 130.0), point(1000.0, 0.0, 0.0)]
SNAPSHOT = FleetReading(
    reachable=True,
    status=STATUS.model_copy(update={"workers": [worker("decode-0", "decode", "cpu:0", busy=0.96, tokens_per_s=128.4)],
                                     "pools": {}}),
    history=FleetHistory.model_validate(HISTORY.model_dump() | {
        "now": 1002.0, "bucket_s": 5.0, "pools": {"decode": SERIES}, "workers": {"decode-0": SERIES}}),
)


def test_charts_leave_out_the_bucket_still_filling() -> None:
    assert SNAPSHOT.pool_series("decode", "busy") == [0.9, 0.95]
    assert SNAPSHOT.worker_series("decode-0", "mbu") == [0.225, 0.2375]
    assert SNAPSHOT.pool_series("prefill", "busy") == []  # no such pool


def test_tokens_per_s_is_the_live_rate() -> None:
    assert SNAPSHOT.tokens_per_s("decode-0") == 128.4
    assert SNAPSHOT.tokens_per_s("decode-9") == 0.0


def test_the_tier_line_takes_the_longest_form_that_fits() -> None:
    tiers = {"host": TierInfo(used_bytes=5, capacity_bytes=100), "disk": TierInfo(used_bytes=0, capacity_bytes=10)}
    served = {"host": 1104}
    assert tier_line(tiers, served, 80) == "tiers: host 1.1k tok, 5% full · disk 0 tok, 0% full"
    assert tier_line(tiers, served, 38) == "tiers host 1.1k tok 5% · disk 0 tok 0%"
    assert tier_line(tiers, served, 30) == "tiers host 1.1k 5% · disk 0 0%"
    assert tier_line(tiers, served, 10) == "host 1.1k 5% · disk 0 0%"


def test_the_structured_line_counts_by_kind_most_first_in_the_form_that_fits() -> None:
    structured = {"tools": 5, "json_schema": 9, "grammar": 1}
    assert structured_line(structured, 80) == "structured output: 9 json schema · 5 tool calls · 1 grammar"
    assert structured_line(structured, 56) == "structured 15: 9 schema, 5 tools, 1 grammar"  # 120 columns
    assert structured_line(structured, 30) == "15 structured"


def test_the_flow_line_counts_arrivals_and_says_when_the_fleet_does_not_disaggregate() -> None:
    flow = FlowInfo(window_s=60, handoffs=42, local_prefills=3, colocated=0, recomputes=1, decode_recomputes=1)
    assert flow_line(flow, disaggregated=True) == ("last min: 42 handed off · 3 local · 1 recomputed (1 here)", False)
    local = FlowInfo(window_s=60, handoffs=4, local_prefills=15, colocated=0, recomputes=1, decode_recomputes=1)
    assert flow_line(local, disaggregated=True) == (
        "not disaggregating: 80% of 20 prompts came without a handoff", True)
    assert flow_line(local, disaggregated=False)[1] is False  # a fleet without a prefill pool is local by design
    few = FlowInfo(window_s=60, handoffs=0, local_prefills=4, colocated=0, recomputes=0, decode_recomputes=0)
    assert flow_line(few, disaggregated=True) == ("last min: 0 handed off · 4 local · 0 recomputed", False)


def test_an_event_line_says_each_detail_short() -> None:
    move = EventRecord(ts=0.0, kind="move", worker="decode-1", details={
        "from": "decode-1", "to": "mixed-1", "request": "req-32d8de23b2624cfd", "stages": [{}, {}, {}, {}],
        "bytes": 2580480, "downtime_s": 0.05482, "error": "the destination refused: no room for 12 blocks"})
    assert event_line(move) == ("00:00:00 move      decode-1   decode-1→mixed-1 request req-32d8de23b26… stages 4 "
                                "bytes 2.6 MB downtime 55 ms error the destination refused: no room for 12 blocks")


def test_the_regret_label_puts_the_advice_in_the_cells_it_has() -> None:
    def label(current: str, best: str, verdict: str, target: str = "") -> str:
        return regret_label(SplitRegretInfo(ratio=0.85, current=current, best=best, at=0.0, series=[0.85],
                                            verdict=verdict, target=target or best))

    assert label("2:4", "2:4", "keep") == "layout 2:4 is best"
    assert label("2:4", "3:3", "move") == "layout 85% of 3:3: move"
    assert label("1:2", "colocated 3", "move") == "move to colocated 3"
    assert label("2:4", "3:3", "keep", "2:4") == "keep 2:4 (85% of 3:3)"
    assert label("1:2", "colocated 3", "keep", "1:2") == "keep 1:2 (within error)"
    assert label("1:2", "colocated 3", "move", "2:1") == "move to 2:1 (held)"  # the move advised before holds
    assert label("2:4", "3:3", "") == "layout 85% of 3:3"  # a fleet from before the advice
    assert all(len(label("1:2", best, verdict)) <= REGRET_LABEL_W for best in ("3:3", "colocated 3")
               for verdict in ("keep", "move"))
