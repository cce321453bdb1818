"""Agent traffic with the prefix cache on vs off: the same `bench --trace agent` sessions (a shared system
prompt with tool descriptions, 4-12 turns of tool results and answers, each turn re-sending the whole
conversation) against two fresh disaggregated fleets started here one after the other, one with
`--no-prefix-cache`; same model, devices, dtype and trace, same run.

    python scripts/bench_agent_cache.py [--model smollm2-135m] [--requests 48] [--rate 0.2]
                                        [--devices cpu:0,cpu:1] [--max-model-len 0] [--local-prefill-tokens N]
                                        [--local-sweep 0,64,256,1024] [--tool-time S] [--json]

Per fleet: the prefix hit ratio (tokens; from the store), TTFT p50/p99 of first turns and of later turns
(at the client), throughput, local prefills, and the decode share of model time from `classify` over
that fleet's own store (model time per request is its share of the steps it computed in: tokens served
from the cache cost none). Then the ratios off/on. The goals (DESIGN §7): decode >= 90 % of model time
with the cache on, later turns' TTFT >= 3x better than with it off.

`--local-sweep N,N,…` runs, instead, the same trace with the cache on once per `--local-prefill-tokens` value
(conditional disaggregation) and prints each run's later-turn TTFT, throughput, local prefills and decode
share: where more local prefill stops helping is the crossover `serve`'s default comes from.

`--tool-time S` makes each later turn wait for a tool call of S s on average after the previous one ended: the
pause in which other sessions' turns churn a small pool, so that a session comes back to a recompute.

`--tiers` runs, instead, the same trace with the cache on and the KV pool held to `--kv-blocks` (about a third
of the sessions' KV; the fleet's context is at most the pool's tokens) five times (`--runs` picks some): no
tiers, a host-memory tier (`--kv-offload-memory`), a small host tier over a disk tier (`--kv-offload-gb`), the
host tier with sessions retained in the pools (`--session-ttl`: the trace names each turn's session), and the
host tier written through (`--kv-offload-policy write-through`: a block a decode worker computes is there for
the prefill worker at once), each tier in a fresh folder of its own; it prints each run's later-turn TTFT
p50/p90/p99, hit ratio (pool and tiers together), prompt tokens computed, throughput, decode share and the
tokens each tier served, and the ratios to the run without.

`--local-prefill-tokens` is passed to both fleets (conditional disaggregation; with the cache off nothing is
cached, so nothing is prefilled locally). `--max-model-len` caps the context the sessions are sized to (0: the
model's own); on a CPU a smaller one keeps the cache-off run (every turn prefills the whole conversation
again) within minutes.
"""

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from fleetctl.console.cli.models import resolve_model
from fleetctl.console.client import FleetClient
from fleetctl.console.loadgen.local_fleet import local_fleet
from fleetctl.console.loadgen.runner import run_bench
from fleetctl.console.loadgen.traces import load_trace
from fleetctl.store.classify import classify
from fleetctl.store.db import open_db

WINDOW_S = 7 * 86400  # the whole of a fresh store


def by_tier(metrics: str, family_name: str) -> dict[str, float]:
    """A per-tier counter of /metrics (`fleet_kv_tier_hits`: prompt tokens served; `fleet_kv_tier_read_bytes`,
    `fleet_kv_tier_read_seconds`), summed over workers."""
    served: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics):
        if family.name == family_name:
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    tier = sample.labels["tier"]
                    served[tier] = served.get(tier, 0) + sample.value
    return served


def run_fleet(model: Path, layout: list[str], store: Path, trace_args: tuple, cache: bool,
              extra: tuple[str, ...] = ()) -> dict:
    flags = [] if cache else ["--no-prefix-cache"]
    with local_fleet(model, *layout, "--store", str(store), *flags, *extra) as url:
        context = FleetClient(url).get("/v1/models")["data"][0]["max_model_len"]
        count, rate, seed, tool_s = trace_args
        name, trace = load_trace("agent", count, rate, seed, context, tool_s)
        result = asyncio.run(run_bench(url, trace, name, slo_ttft=10.0, slo_tpot=1.0))
        status = FleetClient(url).status()
        metrics = httpx.get(f"{url}/metrics", timeout=60).text
    tier_hits = {tier: int(tokens) for tier, tokens in by_tier(metrics, "fleet_kv_tier_hits").items()}
    db = open_db(store)
    try:
        phases = classify(db, WINDOW_S)
    finally:
        db.close()
    return {
        "context": context,
        "sessions": len({t.session_id for t in trace}),
        "requests": result["requests"],
        "errors": result["errors"],
        "duration_s": result["duration_s"],
        "throughput_tokens_per_s": result["throughput_tokens_per_s"],
        "ttft_first_turn_s": result["ttft_first_turn_s"],
        "ttft_later_turns_s": result["ttft_later_turns_s"],
        "prefix_hit_ratio": round(phases.prefix_hit_ratio, 4),
        "pool_hit_ratio": {role: pool.prefix_hit_ratio for role, pool in status.pools.items()},
        "prefill_cached_tokens": phases.prefill_cached_tokens,
        "prefill_computed_tokens": phases.prefill_computed_tokens,
        "local_prefills": phases.local_prefills,
        "tier_hit_tokens": tier_hits,
        "tier_read_bytes": by_tier(metrics, "fleet_kv_tier_read_bytes"),
        "tier_read_s": by_tier(metrics, "fleet_kv_tier_read_seconds"),
        "decode_share": round(phases.decode_share, 4),
        "prefill_model_s": round(phases.prefill_model_s, 3),
        "decode_model_s": round(phases.decode_model_s, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--requests", type=int, default=48, help="turns in all")
    parser.add_argument("--rate", type=float, default=0.2, help="sessions starting per second")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tool-time", type=float, default=0.0,
                        help="mean seconds of a tool call between a session's turns (bench --tool-time)")
    parser.add_argument("--devices", default="cpu:0,cpu:1")
    parser.add_argument("--decode", type=int, default=1, help="decode workers (the rest of --devices: one prefill)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-model-len", type=int, default=0)
    parser.add_argument("--local-prefill-tokens", type=int, default=None)
    parser.add_argument("--local-sweep", default="", help="comma-separated --local-prefill-tokens values")
    parser.add_argument("--tiers", action="store_true", help="no tiers vs host vs host + disk, the pool held small")
    parser.add_argument("--kv-blocks", type=int, default=64, help="each worker's KV pool with --tiers")
    parser.add_argument("--host-mib", type=int, default=256, help="the host tier with --tiers (alone)")
    parser.add_argument("--runs", default=",".join(TIER_RUNS), help="with --tiers: which runs (none first)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    model = resolve_model(args.model)
    layout = ["--prefill", "1", "--decode", str(args.decode), "--devices", args.devices, "--dtype", args.dtype]
    if args.max_model_len:
        layout += ["--max-model-len", str(args.max_model_len)]
    if args.local_prefill_tokens is not None:
        layout += ["--local-prefill-tokens", str(args.local_prefill_tokens)]
    trace_args = (args.requests, args.rate, args.seed, args.tool_time)
    if args.local_sweep:
        sweep(model, layout, trace_args, [int(n) for n in args.local_sweep.split(",")])
        return
    if args.tiers:
        names = args.runs.split(",")
        if names[0] != "none" or not set(names) <= set(TIER_RUNS):
            parser.error(f"--runs: none first, then any of {', '.join(TIER_RUNS[1:])}")
        tiers(model, [*layout, "--kv-blocks", str(args.kv_blocks)], trace_args, args.host_mib, names)
        return
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for cache in (True, False):
            key = "cache_on" if cache else "cache_off"
            results[key] = run_fleet(model, layout, Path(tmp) / f"{key}.db", trace_args, cache)
            if not args.json:
                print(key, json.dumps(results[key]), flush=True)
    on, off = results["cache_on"], results["cache_off"]

    def ratio(a: float, b: float) -> float | None:
        return round(a / b, 2) if b else None

    results["ratios"] = {
        "ttft_later_turns_p50_off_over_on": ratio(off["ttft_later_turns_s"]["p50"], on["ttft_later_turns_s"]["p50"]),
        "ttft_later_turns_p99_off_over_on": ratio(off["ttft_later_turns_s"]["p99"], on["ttft_later_turns_s"]["p99"]),
        "ttft_first_turn_p50_off_over_on": ratio(off["ttft_first_turn_s"]["p50"], on["ttft_first_turn_s"]["p50"]),
        "throughput_on_over_off": ratio(on["throughput_tokens_per_s"], off["throughput_tokens_per_s"]),
        "computed_prefill_tokens_on_over_off": ratio(on["prefill_computed_tokens"], off["prefill_computed_tokens"]),
    }
    if args.json:
        print(json.dumps(results))
        return
    print("ratios", json.dumps(results["ratios"]))
    print(f"decode share of model time: cache on {on['decode_share']:.1%} (goal >= 90%), off {off['decode_share']:.1%}")


TIER_RUNS = ("none", "host", "host+disk", "host+sessions", "write-through")


def tiers(model: Path, layout: list[str], trace_args: tuple, host_mib: int, names: list[str]) -> None:
    """The cache on with a small pool (the runs of `names`): without tiers, over a host tier, over a small host
    tier and a disk one, with sessions retained, written through."""
    print(f"{'tiers':>13} {'later TTFT p50':>15} {'p90':>8} {'p99':>8} {'tokens/s':>9} {'hit ratio':>10} "
          f"{'computed':>9} {'decode share':>13} {'errors':>7}  tier hits (tokens)")
    runs = {}
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        for name, extra in (
                ("none", ()),
                ("host", ("--kv-offload-memory", str(host_mib), "--kv-offload-host-dir", f"{shm}/host")),
                ("host+disk", ("--kv-offload-memory", str(max(1, host_mib // 8)), "--kv-offload-host-dir",
                               f"{shm}/small", "--kv-offload-dir", f"{tmp}/disk", "--kv-offload-gb", "4")),
                ("host+sessions", ("--kv-offload-memory", str(host_mib), "--kv-offload-host-dir", f"{shm}/sessions",
                                   "--session-ttl", "600")),
                ("write-through", ("--kv-offload-memory", str(host_mib), "--kv-offload-host-dir", f"{shm}/through",
                                   "--kv-offload-policy", "write-through"))):
            if name not in names:
                continue
            run = runs[name] = run_fleet(model, layout, Path(tmp) / f"{name}.db", trace_args, True, extra)
            later = run["ttft_later_turns_s"]
            print(f"{name:>13} {later['p50']:>13.3f} s {later['p90']:>6.3f} s {later['p99']:>6.3f} s "
                  f"{run['throughput_tokens_per_s']:>9.2f} {run['prefix_hit_ratio']:>10.1%} "
                  f"{run['prefill_computed_tokens']:>9} {run['decode_share']:>13.1%} {run['errors']:>7}  "
                  f"{run['tier_hit_tokens'] or '-'}", flush=True)
    none = runs["none"]["ttft_later_turns_s"]
    for name in (name for name in TIER_RUNS[1:] if name in runs):
        later = runs[name]["ttft_later_turns_s"]
        print(f"{name}: later-turn TTFT p50 {none['p50'] / later['p50']:.2f}x better, p99 "
              f"{none['p99'] / later['p99']:.2f}x, than without tiers")
        run = runs[name]
        recompute = run["prefill_computed_tokens"] / run["prefill_model_s"] if run["prefill_model_s"] else 0.0
        for tier, seconds in run["tier_read_s"].items():
            tokens = run["tier_hit_tokens"].get(tier, 0)
            if seconds > 0:
                print(f"  {tier} tier read {run['tier_read_bytes'][tier] / seconds / 1e9:.2f} GB/s: "
                      f"{tokens / seconds:,.0f} prompt tokens/s vs {recompute:,.0f}/s computing them")


def sweep(model: Path, layout: list[str], trace_args: tuple, thresholds: list[int]) -> None:
    """The cache on, once per --local-prefill-tokens value, same trace: one line each."""
    print(f"{'local ≤':>8} {'later TTFT p50':>15} {'p99':>8} {'tokens/s':>9} {'local':>6} {'hit ratio':>10} "
          f"{'decode share':>13}")
    with tempfile.TemporaryDirectory() as tmp:
        for threshold in thresholds:
            run = run_fleet(model, [*layout, "--local-prefill-tokens", str(threshold)], Path(tmp) / f"{threshold}.db",
                            trace_args, cache=True)
            later = run["ttft_later_turns_s"]
            print(f"{threshold:>8} {later['p50']:>13.3f} s {later['p99']:>6.3f} s "
                  f"{run['throughput_tokens_per_s']:>9.2f} {run['local_prefills']:>6} "
                  f"{run['prefix_hit_ratio']:>10.1%} {run['decode_share']:>13.1%}",
                  flush=True)


if __name__ == "__main__":
    main()
