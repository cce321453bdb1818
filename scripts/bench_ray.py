"""Ray fleets measured against the single-node path, on this machine, in one run (the machine is noisy: only
ratios within a run mean something).

1. KV handoff GB/s for a few KV sizes, through the production transport code: a buffer published to shared
   memory, fetched by a worker actor on the producer's node (memory-mapped, as local fleets do) and by one
   on another node of a `ray.cluster_utils.Cluster` (pulled through Ray's object store, `RayPull`).
2. Completion latency: `fleetctl serve` with local worker processes and with `--ray auto` (the same devices,
   all on one node), both up at once; each request of a chat trace goes to one, then the other, one at a time
   (the same noise for both, no queue): TTFT, TPOT and E2E percentiles and their ratios.

    python scripts/bench_ray.py [--model smollm2-135m] [--requests 16] [--max-tokens 32] [--prompt-words N]
                                [--sizes-mib 1,16,64] [--skip-handoff] [--json]
"""

import argparse
import asyncio
import dataclasses
import json
import os
import time

import httpx
import ray
from ray.cluster_utils import Cluster

from fleetctl.console.loadgen.local_fleet import local_fleet
from fleetctl.console.loadgen.requests import TraceRequest
from fleetctl.console.loadgen.runner import Outcome, percentile_json, stream_request
from fleetctl.console.loadgen.synthetic import TraceKind, make_trace
from fleetctl.engine.worker.ray_actor import RayWorker
from fleetctl.engine.worker.ray_nodes import CPU_SLOT_RESOURCE, NAMESPACE, NODE_RESOURCE, nodes, placement, resolve

REPEATS = 5
OBJECT_STORE = 512 * 2**20


class Consumer:
    """A worker-like actor that fetches handles the way a decode worker does (KVTransport.fetch)."""

    def __init__(self, name: str) -> None:
        from fleetctl.engine.worker.kv_transport import KVTransport
        from fleetctl.engine.worker.ray_actor import RayPull

        self.transport = KVTransport(remote=RayPull(ray.get_runtime_context().get_node_id(), name))

    def fetch_seconds(self, handle) -> tuple[float, bool]:
        import torch

        start = time.perf_counter()
        kv = self.transport.fetch(handle, torch.device("cpu"))
        seconds = time.perf_counter() - start
        assert kv.numel() * kv.element_size() == handle.nbytes
        return seconds, self.transport.is_remote(handle)


def handoff_rates(sizes_mib: list[int]) -> list[dict]:
    import torch

    from fleetctl.engine.api.device_names import parse_device_name
    from fleetctl.engine.worker.kv_transport import KVTransport

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {f"{NODE_RESOURCE}node1": 1, CPU_SLOT_RESOURCE: 2},
        "object_store_memory": OBJECT_STORE, "include_dashboard": False})
    cluster.add_node(num_cpus=1, resources={f"{NODE_RESOURCE}node2": 1, CPU_SLOT_RESOURCE: 2},
                     object_store_memory=OBJECT_STORE)
    ray.init(address=cluster.address, namespace=NAMESPACE, include_dashboard=False)
    rows = []
    try:
        def on(device: str, cls, *args):
            name = parse_device_name(device, indexed=True)
            return ray.remote(max_concurrency=4)(cls).options(name=f"bench-{device.replace('/', '-')}",
                                                              **placement(name, resolve(name))).remote(*args)

        producer = on("node1/cpu:0", RayWorker, "bench-node1-cpu:0")  # serves read_kv for node2's pulls
        same, other = on("node1/cpu:1", Consumer, "c1"), on("node2/cpu:0", Consumer, "c2")
        node1 = nodes()["node1"].node_id
        transport = KVTransport(fleet_pid=os.getpid())
        for mib in sizes_mib:
            # [layers, 2, blocks, 16, Hkv=3, d=64] in fp32: 24 KiB per layer-block pair
            blocks = max(1, mib * 2**20 // (30 * 2 * 16 * 3 * 64 * 4))
            kv = torch.randn(30, 2, blocks, 16, 3, 64)
            handle = transport.publish(kv)
            handle = dataclasses.replace(handle, node=node1, owner="bench-node1-cpu:0")
            row = {"kv_mib": round(handle.nbytes / 2**20, 1)}
            for route, consumer in (("same-node shm", same), ("cross-node object store", other)):
                timings = [ray.get(consumer.fetch_seconds.remote(handle)) for _ in range(REPEATS)]
                assert all(remote == (route != "same-node shm") for _, remote in timings)
                best = min(seconds for seconds, _ in timings)
                row[route] = {"best_s": round(best, 5), "gb_per_s": round(handle.nbytes / best / 1e9, 3)}
            row["shm_over_object_store"] = round(row["same-node shm"]["gb_per_s"]
                                                 / row["cross-node object store"]["gb_per_s"], 2)
            transport.release(handle)
            rows.append(row)
        del producer
    finally:
        ray.shutdown()
        cluster.shutdown()
    return rows


async def alternate(urls: dict[str, str], requests: list[TraceRequest]) -> dict[str, list[Outcome]]:
    """Each trace request sent to every fleet in turn, one at a time: both see the same machine noise, and
    no queue forms, so the differences are the path's own."""
    outcomes: dict[str, list[Outcome]] = {name: [] for name in urls}
    clients = {name: httpx.AsyncClient(base_url=url, timeout=600) for name, url in urls.items()}
    models = {name: (await client.get("/v1/models")).json()["data"][0]["id"] for name, client in clients.items()}
    for req in requests:
        for name, client in clients.items():
            outcomes[name].append(await stream_request(client, models[name], dataclasses.replace(req, arrival_s=0.0),
                                                       time.perf_counter()))
    for client in clients.values():
        await client.aclose()
    return outcomes


def latency(model: str, count: int, max_tokens: int, prompt_words: int) -> dict:
    layout = ("--prefill", "1", "--decode", "2", "--devices", "cpu:0,cpu:1,cpu:2", "--no-access-log")
    trace = [dataclasses.replace(r, max_tokens=max_tokens, prompt=" ".join(r.prompt.split()[:prompt_words or None]))
             for r in make_trace(TraceKind.CHAT, count + 2, 0.0)]
    with local_fleet(model, *layout) as local_url, local_fleet(model, *layout, "--ray", "auto") as ray_url:
        runs = asyncio.run(alternate({"local": local_url, "ray": ray_url}, trace))
    report = {}
    for name, outcomes in runs.items():
        done = [o for o in outcomes[2:] if not o.error]  # the first two warm both fleets up
        cuts = {key: percentile_json([getattr(o, key) for o in done]) for key in ("ttft_s", "tpot_s", "e2e_s")}
        errors = [o.error for o in outcomes if o.error]
        report[name] = {"requests": len(done), "errors": len(errors), "first_error": errors[0] if errors else None,
                        **cuts}
    report["ray_over_local_p50"] = {key: round(report["ray"][key]["p50"] / report["local"][key]["p50"], 3)
                                    for key in ("ttft_s", "tpot_s", "e2e_s") if report["local"][key]["p50"]}
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--prompt-words", type=int, default=0, help="cut prompts to this many words (a small "
                                                                        "model's context; 0: as the trace has them)")
    parser.add_argument("--sizes-mib", default="1,16,64")
    parser.add_argument("--skip-handoff", action="store_true")
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args()
    report = {"handoff": [] if opts.skip_handoff else handoff_rates([int(s) for s in opts.sizes_mib.split(",")]),
              "latency": latency(opts.model, opts.requests, opts.max_tokens, opts.prompt_words)}
    if opts.json:
        print(json.dumps(report))
        return
    for row in report["handoff"]:
        print(f"KV {row['kv_mib']:>6} MiB  same-node shm {row['same-node shm']['gb_per_s']:>7.3f} GB/s  "
              f"cross-node object store {row['cross-node object store']['gb_per_s']:>7.3f} GB/s  "
              f"ratio {row['shm_over_object_store']}x")
    for name in ("local", "ray"):
        run = report["latency"][name]
        print(f"{name:<6} TTFT p50 {run['ttft_s']['p50']:.4f} s  TPOT p50 {run['tpot_s']['p50']:.4f} s  "
              f"E2E p50 {run['e2e_s']['p50']:.4f} s  ({run['requests']} requests, {run['errors']} errors)")
    print("ray / local p50:", report["latency"]["ray_over_local_p50"])


if __name__ == "__main__":
    main()
