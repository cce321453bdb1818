"""Overload is a clear answer: a burst far past `--max-queue` on a real fleet, twice, then as many streamed requests
as the first burst admitted, unloaded (at most --max-queue at a time), for the TTFT they would have had.

    python scripts/burst.py [--model DIR] [--requests 300] [--max-queue 8] [--max-tokens 16] [--json]

Without --model it writes the tests' tiny random Llama to a temporary directory. Prints each burst's answers by
status (200 / 429 / 5xx), the 429s without a clear answer (Retry-After of whole seconds, the API's error body),
TTFT p50/p99 of the admitted streams against the unloaded run, /health's p99 during the bursts, the CPU seconds
the load, the controller and the workers spent in each burst (they share this machine's cores), and the `serve`
process's RSS before, after the first burst and after the second.
"""

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from fleetctl.console.loadgen.burst import BurstResult, burst
from fleetctl.console.loadgen.local_fleet import local_fleet
from fleetctl.store.db import open_db
from fleetctl.store.queries import percentiles

MiB = 2**20


def fleet_args(max_queue: int, store: Path) -> list[str]:
    return ["--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1", "--dtype", "float32",
            "--max-queue", str(max_queue), "--no-access-log", "--store", str(store)]


def fleet_ttft(store: Path, since: float, until: float) -> dict[str, float]:
    """TTFT p50/p99 as the fleet recorded it (from admission to the first token: no HTTP, no load generator) of
    the requests that arrived in [since, until)."""
    db = open_db(store)
    try:
        rows = [r[0] for r in db.execute("SELECT ttft_s FROM requests WHERE ts >= ? AND ts < ? AND outcome = 'ok'",
                                         [since, until]).fetchall()]
    finally:
        db.close()
    found = percentiles(rows)
    return {"requests": len(rows), "p50": round(found.p50 or 0.0, 4), "p99": round(found.p99 or 0.0, 4)}


def summary(result: BurstResult) -> dict:
    ttft, health = percentiles(result.ttft_s), percentiles(result.health_s)
    return {"statuses": dict(sorted(result.statuses.items())), "server_errors": result.server_errors,
            "unclear_refusals": len(result.unclear_refusals), "stream_errors": len(result.stream_errors),
            "admitted_streams": len(result.ttft_s),
            "ttft_s": {"p50": round(ttft.p50 or 0.0, 4), "p99": round(ttft.p99 or 0.0, 4)},
            "health": {"calls": len(result.health_s), "statuses": dict(result.health_statuses),
                       "p99_s": round(health.p99 or 0.0, 4), "max_s": round(max(result.health_s, default=0.0), 4)}}


def cpu_seconds(controller: psutil.Process) -> dict[str, float]:
    """CPU seconds so far of this process (the load), the controller, and its workers (the profile of a burst on
    a machine where they all share the cores)."""
    def spent(process: psutil.Process) -> float:
        times = process.cpu_times()
        return times.user + times.system

    workers = controller.children(recursive=True)
    return {"client": spent(psutil.Process()), "controller": spent(controller),
            "workers": sum(spent(worker) for worker in workers)}


def measure(model: Path, requests: int, max_queue: int, max_tokens: int, store: Path) -> dict:
    with local_fleet(model, *fleet_args(max_queue, store)) as url:
        controller = psutil.Process(httpx.get(f"{url}/fleet/status", timeout=10).json()["pid"])
        name = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
        asyncio.run(burst(url, name, max_queue, max_tokens))  # warm: first requests, first compiled paths
        rss = [controller.memory_info().rss]
        bursts, cpu, windows = [], [], []
        for _ in range(2):
            before, started, since = cpu_seconds(controller), time.monotonic(), time.time()
            bursts.append(asyncio.run(burst(url, name, requests, max_tokens)))
            cpu.append({who: round(spent - before[who], 2) for who, spent in cpu_seconds(controller).items()}
                       | {"wall": round(time.monotonic() - started, 2)})
            windows.append((since, time.time()))
            rss.append(controller.memory_info().rss)
        admitted = len(bursts[0].ttft_s)
        since = time.time()
        unloaded = asyncio.run(burst(url, name, admitted, max_tokens, streamed_share=1.0, in_flight=max_queue))
        windows.append((since, time.time()))
        time.sleep(2.5)  # the store's writer flushes once a second
    fleet_side = [fleet_ttft(store, *window) for window in windows]
    loaded_ttft, unloaded_ttft = percentiles(bursts[0].ttft_s), percentiles(unloaded.ttft_s)
    return {"requests": requests, "max_queue": max_queue, "max_tokens": max_tokens,
            "bursts": [summary(b) | {"cpu_s": c, "fleet_ttft_s": f}
                       for b, c, f in zip(bursts, cpu, fleet_side[:2], strict=True)],
            "unloaded": summary(unloaded) | {"fleet_ttft_s": fleet_side[-1]},
            "ttft_ratio": {"p50": round((loaded_ttft.p50 or 0.0) / (unloaded_ttft.p50 or 1.0), 2),
                           "p99": round((loaded_ttft.p99 or 0.0) / (unloaded_ttft.p99 or 1.0), 2)},
            "rss_mib": {"before": round(rss[0] / MiB, 1), "after_first": round(rss[1] / MiB, 1),
                        "after_second": round(rss[2] / MiB, 1)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a model directory (default: the tests' tiny random Llama)")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--max-queue", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        if args.model is None:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
            from support.tiny_model import write_tiny_llama

            args.model = write_tiny_llama(Path(scratch))
        report = measure(args.model, args.requests, args.max_queue, args.max_tokens, Path(scratch) / "fleet.db")
    if args.json:
        print(json.dumps(report))
        return
    for i, b in enumerate(report["bursts"], 1):
        print(f"burst {i}: {report['requests']} requests -> {b['statuses']} (5xx: {b['server_errors']}, unclear "
              f"429s: {b['unclear_refusals']}, broken streams: {b['stream_errors']}); admitted streams "
              f"{b['admitted_streams']}, TTFT p50 {b['ttft_s']['p50']:.3f} s p99 {b['ttft_s']['p99']:.3f} s; "
              f"/health {b['health']['calls']} calls {b['health']['statuses']}, p99 {b['health']['p99_s']:.3f} s "
              f"max {b['health']['max_s']:.3f} s; CPU s over {b['cpu_s']['wall']} s: client {b['cpu_s']['client']}, "
              f"controller {b['cpu_s']['controller']}, workers {b['cpu_s']['workers']}; as the fleet recorded it "
              f"(admission to first token) TTFT p50 {b['fleet_ttft_s']['p50']:.3f} s "
              f"p99 {b['fleet_ttft_s']['p99']:.3f} s over {b['fleet_ttft_s']['requests']} requests")
    u = report["unloaded"]
    print(f"unloaded: {u['admitted_streams']} streams (<= {report['max_queue']} at a time) -> {u['statuses']}, "
          f"TTFT p50 {u['ttft_s']['p50']:.3f} s p99 {u['ttft_s']['p99']:.3f} s; burst/unloaded ratio p50 "
          f"{report['ttft_ratio']['p50']} p99 {report['ttft_ratio']['p99']}; as the fleet recorded it TTFT p50 "
          f"{u['fleet_ttft_s']['p50']:.3f} s p99 {u['fleet_ttft_s']['p99']:.3f} s")
    r = report["rss_mib"]
    print(f"serve RSS: {r['before']} MiB before, {r['after_first']} after burst 1, {r['after_second']} after burst 2")


if __name__ == "__main__":
    main()
