"""A live trip through layouts under the demo's traffic: by default 1 prefill + 2 decode → colocated 3 → 1:2,
each step `rebalance` by role switches in place (smollm2 on CPU slots by default); `--start 1:1 --devices
cpu:0,cpu:1,cpu:2,cpu:3 --route 2:2 1:1` grows the fleet onto free devices and shrinks it back. Prints, for
the windows before, during each rebalance, on each layout, and after: requests finished, goodput (requests/s
within the SLOs) and TTFT p50/p99; the rebalances' seconds, workers started and stopped, and sessions moved;
and the requests that ended in an error (the sessions lost: 0 is the goal).

    python scripts/bench_layouts.py [--model smollm2-135m] [--window 40] [--slo-ttft 2] [--slo-tpot 0.2]
                                    [--start 1:2] [--devices cpu:0,cpu:1,cpu:2] [--route "colocated 3" 1:2]
"""

import argparse
import itertools
import statistics
import time

import httpx
from bench_switch import rebalance  # scripts/ is on the path of a script run from it

from fleetctl.console.cli.models import resolve_model
from fleetctl.console.demo.traffic import DemoTraffic, plan_traffic
from fleetctl.console.loadgen.local_fleet import local_fleet
from fleetctl.engine.planner.split import parse_split


def timed_rebalance(url: str, split: str) -> tuple[dict, float, float]:
    """(the rebalance's result, when it was asked for, when it ended)."""
    started = time.time()
    result = rebalance(url, split, "switch")
    return result, started, time.time()


def window_row(name: str, records: list[dict], start: float, end: float, slo_ttft: float, slo_tpot: float) -> str:
    """Requests that arrived in [start, end): finished, within the SLOs per second, TTFT p50/p99."""
    arrived = [r for r in records if start <= r["arrival"] < end and r["outcome"] != "running"]
    done = [r for r in arrived if r["outcome"] != "error"]
    good = [r for r in done if r["ttft_s"] <= slo_ttft and _tpot(r) <= slo_tpot]
    ttfts = sorted(r["ttft_s"] for r in done)
    p50 = statistics.median(ttfts) if ttfts else float("nan")
    p99 = ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if ttfts else float("nan")
    seconds = end - start
    return (f"{name:<22} {seconds:7.1f} s {len(done):5} done {len(arrived) - len(done):3} errors "
            f"goodput {len(good) / seconds:6.3f} req/s  TTFT p50 {p50:6.3f} s p99 {p99:6.3f} s")


def _tpot(record: dict) -> float:
    tokens = record["output_tokens"]
    return record["decode_s"] / (tokens - 1) if tokens > 1 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--window", type=float, default=40.0, help="Seconds on each layout.")
    parser.add_argument("--phase-seconds", type=float, default=20.0, help="The demo traffic's phase length.")
    parser.add_argument("--slo-ttft", type=float, default=2.0)
    parser.add_argument("--slo-tpot", type=float, default=0.2)
    parser.add_argument("--start", default="1:2", help="The fleet's first layout.")
    parser.add_argument("--devices", default="cpu:0,cpu:1,cpu:2", help="Its devices, free ones beyond its workers.")
    parser.add_argument("--route", nargs="+", default=["colocated 3", "1:2"], help="The layouts it goes through.")
    args = parser.parse_args()
    model = resolve_model(args.model)
    first = parse_split(args.start)
    shape = (["--colocated", str(first.mixed)] if first.mixed
             else ["--prefill", str(first.prefill), "--decode", str(first.decode)])
    with local_fleet(model, *shape, "--devices", args.devices) as url:
        served, config = plan_traffic(url, args.phase_seconds)
        traffic = DemoTraffic(url, served, config)
        traffic.start()
        marks, results = [(f"{first.label} first", time.time())], []
        for layout in args.route:
            time.sleep(args.window)
            result, started, ended = timed_rebalance(url, layout)
            results.append(result)
            marks += [(f"rebalance -> {parse_split(layout).label}", started), (parse_split(layout).label, ended)]
        time.sleep(args.window)
        marks.append(("end", time.time()))
        phases = traffic.stop()
        records = httpx.get(f"{url}/fleet/requests", params={"limit": 10_000}, timeout=60).json()["requests"]
    for (name, start), (_, end) in itertools.pairwise(marks):
        print(window_row(name, records, start, end, args.slo_ttft, args.slo_tpot))
    for result in results:
        moves = [f"{m['worker']}->{m['new_worker']} {m['seconds']:.3f} s moved {m['sessions_moved']}"
                 for m in result["moves"]]
        moves += [f"started {s['worker']} on {s['device']} {s['seconds']:.3f} s" for s in result.get("started", [])]
        moves += [f"stopped {s['worker']} {s['seconds']:.3f} s moved {s['sessions_moved']}"
                  for s in result.get("stopped", [])]
        print(f"rebalance {result['from']} -> {result['split']} via {result['via']}: {result['seconds']:.3f} s "
              f"({', '.join(moves)})")
    errors = sum(p.errors for p in phases)
    print(f"requests sent {sum(p.sent for p in phases)}, completed {sum(p.completed for p in phases)}, "
          f"ended in an error (sessions lost) {errors}; SLOs TTFT <= {args.slo_ttft:g} s, TPOT <= {args.slo_tpot:g} s")


if __name__ == "__main__":
    main()
