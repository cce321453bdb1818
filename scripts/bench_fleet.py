"""Disaggregated vs colocated on the same devices, same trace, same run; plus the KV handoff's cost.

    python scripts/bench_fleet.py [--model smollm2-135m] [--requests 24] [--rate 1.0] [--devices cpu:0,cpu:1]

Prints, per layout, the `fleetctl bench` result, and for the disaggregated fleet the handoff's share
of end-to-end latency (target <= 0.8 %), its GB/s, and the delay it adds before the second token.
"""

import argparse
import asyncio
import json
import statistics

import httpx

from fleetctl.console.cli.models import resolve_model
from fleetctl.console.loadgen.local_fleet import local_fleet
from fleetctl.console.loadgen.runner import run_bench
from fleetctl.console.loadgen.synthetic import TraceKind, make_trace


def handoff_summary(url: str) -> dict:
    records = [r for r in httpx.get(f"{url}/fleet/requests", params={"limit": 10_000}, timeout=30).json()["requests"]
               if r["handoff_bytes"]]
    if not records:
        return {}
    nbytes = sum(r["handoff_bytes"] for r in records)
    seconds = sum(r["handoff_s"] for r in records)
    return {
        "handoffs": len(records),
        "mean_bytes": round(nbytes / len(records)),
        "gb_per_s": round(nbytes / seconds / 1e9, 3) if seconds else None,
        "mean_handoff_s": round(seconds / len(records), 6),
        "second_token_delay_s_mean": round(statistics.mean(r["handoff_wall_s"] for r in records), 6),
        "share_of_e2e": round(seconds / sum(r["e2e_s"] for r in records), 6),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--rate", type=float, default=1.0)
    parser.add_argument("--devices", default="cpu:0,cpu:1")
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    model = resolve_model(args.model)
    trace = make_trace(TraceKind.CHAT, args.requests, args.rate)
    layouts = {"disaggregated": ("--prefill", "1", "--decode", "1"), "colocated": ("--colocated", "2")}
    results = {}
    for name, layout in layouts.items():
        with local_fleet(model, *layout, "--devices", args.devices, "--dtype", args.dtype) as url:
            results[name] = asyncio.run(run_bench(url, trace, "chat", slo_ttft=2.0, slo_tpot=0.2))
            if name == "disaggregated":
                results[name]["handoff"] = handoff_summary(url)
        print(name, json.dumps(results[name]), flush=True)
    dis, col = results["disaggregated"], results["colocated"]
    print(f"throughput disaggregated/colocated: {dis['throughput_tokens_per_s'] / col['throughput_tokens_per_s']:.2f}x")
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        print(f"{key} p50  disaggregated {dis[key]['p50']:.4f}  colocated {col[key]['p50']:.4f}")
    print(f"handoff share of e2e: {dis['handoff_share_of_e2e']:.4%} (target <= 0.8 %)")


if __name__ == "__main__":
    main()
