"""A static prefill:decode split against the same split under `serve --autoplan`, same devices, same `shift`
trace (rag-like first half: prefill-heavy; agent-like second half: decode-heavy), same run: each fleet
started fresh with a store of its own. Prints both runs' goodput and their ratio, then every autoplan
window's decision (wait / apply / hold / skip) with its reason and the rebalances it made.

    python scripts/bench_autoplan.py [--model smollm2-135m] [--devices cpu:0,cpu:1,cpu:2] [--split 2:1]
                                     [--requests 64] [--rate 0.5] [--interval 30] [--min-gain 10]
                                     [--slo-ttft 6] [--slo-tpot 0.3] [--hysteresis S] [--max-workers N]
                                     [--store-dir DIR]

`--devices` may list more devices than the split's workers: with `--max-workers N` autoplan plans elastic
over them and grows or shrinks the fleet (the static fleet keeps its split).

Both fleets run every prompt through the prefill pool (`--local-prefill-tokens 0`), as the planner's replay
assumes. The autoplan window must be short enough for two windows to agree within each half of the trace.
"""

import argparse
import asyncio
import json
import sqlite3
import tempfile
from pathlib import Path

from fleetctl.console.cli.models import resolve_model
from fleetctl.console.loadgen.local_fleet import local_fleet
from fleetctl.console.loadgen.runner import run_bench
from fleetctl.console.loadgen.synthetic import TraceKind, make_trace
from fleetctl.domain import EventKind


def events(store: Path) -> list[tuple[float, str, dict]]:
    """(seconds since the first event, kind, details) of the store's plan and rebalance events."""
    with sqlite3.connect(store) as db:
        rows = db.execute("SELECT ts, kind, details FROM events WHERE kind IN (?, ?) ORDER BY ts",
                          (EventKind.PLAN.value, EventKind.REBALANCE.value)).fetchall()
    start = rows[0][0] if rows else 0.0
    return [(ts - start, kind, json.loads(details)) for ts, kind, details in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--devices", default="cpu:0,cpu:1,cpu:2")
    parser.add_argument("--split", default="2:1", help="P:D both fleets start with (the rag half's split)")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--rate", type=float, default=0.5)
    parser.add_argument("--interval", type=float, default=30.0, help="autoplan window, seconds")
    parser.add_argument("--min-gain", type=float, default=10.0)
    parser.add_argument("--slo-ttft", type=float, default=6.0)
    parser.add_argument("--slo-tpot", type=float, default=0.3)
    parser.add_argument("--hysteresis", type=float, default=0.0,
                        help="seconds between autoplan's changes (default: two windows)")
    parser.add_argument("--max-workers", type=int, default=0, help="elastic autoplan up to N workers (0: off)")
    parser.add_argument("--store-dir", default="", help="keep static.db and autoplan.db here")
    args = parser.parse_args()

    model = str(resolve_model(args.model))
    prefill, decode = args.split.split(":")
    trace = make_trace(TraceKind.SHIFT, args.requests, args.rate)
    common = ["--prefill", prefill, "--decode", decode, "--devices", args.devices, "--local-prefill-tokens", "0"]
    autoplan = ["--autoplan", "--autoplan-interval", str(args.interval), "--min-gain", str(args.min_gain),
                "--autoplan-slo", f"{args.slo_ttft},{args.slo_tpot}",
                "--autoplan-hysteresis", str(args.hysteresis or 2 * args.interval)]
    if args.max_workers:
        autoplan += ["--max-workers", str(args.max_workers)]
    with tempfile.TemporaryDirectory(prefix="fleetctl-autoplan-") as tmp:
        stores = Path(args.store_dir or tmp)
        stores.mkdir(parents=True, exist_ok=True)
        results = {}
        for name, extra in (("static", []), ("autoplan", autoplan)):
            store = stores / f"{name}.db"
            for suffix in ("", "-wal", "-shm"):
                Path(f"{store}{suffix}").unlink(missing_ok=True)
            with local_fleet(model, *common, *extra, "--store", str(store)) as url:
                results[name] = asyncio.run(run_bench(url, trace, "shift", args.slo_ttft, args.slo_tpot))
        decisions = events(stores / "autoplan.db")

    print(f"shift trace, {args.requests} requests at {args.rate}/s on {args.devices}, starting split {args.split}, "
          f"SLOs TTFT <= {args.slo_ttft:g} s, TPOT <= {args.slo_tpot:g} s, autoplan window {args.interval:g} s")
    print(f"{'fleet':<9} {'goodput/s':>9} {'good':>5} {'TTFT p50':>9} {'TTFT p90':>9} {'TPOT p50':>9} "
          f"{'TPOT p90':>9} {'errors':>6}")
    for name, r in results.items():
        good = f"{r['good_requests']}/{r['requests']}"
        print(f"{name:<9} {r['goodput_rps']:>9.3f} {good:>5} {r['ttft_s']['p50']:>8.2f}s {r['ttft_s']['p90']:>8.2f}s "
              f"{r['tpot_s']['p50']:>8.3f}s {r['tpot_s']['p90']:>8.3f}s {r['errors']:>6}")
    static = results["static"]["goodput_rps"]
    ratio = results["autoplan"]["goodput_rps"] / static if static else float("nan")
    print(f"goodput ratio autoplan / static: {ratio:.2f}x")
    for at, kind, details in decisions:
        if kind == EventKind.PLAN.value:
            print(f"  +{at:5.0f}s plan {details['decision']}: {details['reason']}")
        else:
            print(f"  +{at:5.0f}s rebalance: {json.dumps(details)}")


if __name__ == "__main__":
    main()
