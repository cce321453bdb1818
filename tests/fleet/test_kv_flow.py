"""How prompts reached their decoding worker over the last minute (engine/fleet/kv_flow.py): arrivals counted by
kind, handoffs by route with their bytes per second and p99, entries older than the window forgotten, and the
share that came without a handoff."""

from fleetctl.engine.fleet.kv_flow import Arrival, KVFlow


def test_arrivals_by_kind_and_routes_by_bytes() -> None:
    flow = KVFlow(window_s=60.0)
    for i in range(100):
        flow.handoff("prefill-0", "decode-1", 6_000, 0.001 * (i + 1), now=1000.0 + i * 0.1)
    flow.handoff("prefill-1", "decode-0", 1_200, 0.5, now=1005.0)
    flow.arrived(Arrival.LOCAL_PREFILL, now=1006.0)
    flow.arrived(Arrival.RECOMPUTE, now=1006.0)
    flow.arrived(Arrival.DECODE_RECOMPUTE, now=1007.0)
    info = flow.summary(now=1010.0)
    assert (info.handoffs, info.local_prefills, info.colocated, info.recomputes, info.decode_recomputes) == \
        (101, 1, 0, 2, 1)
    busiest, other = info.routes
    assert (busiest.prefill, busiest.decode, busiest.handoffs) == ("prefill-0", "decode-1", 100)
    assert busiest.bytes_per_s == 10_000.0 and busiest.p99_s == 0.099  # nearest rank: the 99th of 100
    assert (other.prefill, other.decode, other.bytes_per_s, other.p99_s) == ("prefill-1", "decode-0", 20.0, 0.5)
    assert info.local_share == 2 / 103


def test_the_window_forgets_old_arrivals() -> None:
    flow = KVFlow(window_s=60.0)
    flow.handoff("prefill-0", "decode-0", 100, 0.01, now=0.0)
    flow.arrived(Arrival.COLOCATED, now=30.0)
    assert flow.summary(now=61.0).handoffs == 0
    info = flow.summary(now=61.0)
    assert info.colocated == 1 and info.routes == [] and info.local_share == 1.0
    assert flow.summary(now=200.0).local_share is None
