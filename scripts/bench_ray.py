"""Ray fleets measured against the single-node path, on this machine, in one run (the machine is noisy: only
ratios within a run mean something).

1. KV handoff GB/s for a few KV sizes, through the production transport code: a buffer published to shared
   memory, fetched by a worker actor on the producer's node (memory-mapped, as local fleets do) and by one
   on another node of a `ray.cluster_utils.Cluster` (pulled through Ray's object store, `RayPull`).
2. Completion latency: the same `fleetctl bench` trace against `fleetctl serve` with local worker processes
   and with `--ray` (the same devices, all on one node): TTFT, TPOT and E2E percentiles and their ratios.

    python scripts/bench_ray.py [--model smollm2-135m] [--requests 16] [--rate 2] [--sizes-mib 1,16,64] [--json]
"""

import argparse
import dataclasses
import json
import os
import sys
import time

import ray
from ray.cluster_utils import Cluster

from fleetctl.console.local_fleet import FLEETCTL, local_fleet
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

    from fleetctl.engine.core.device_names import parse_device_name
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


def bench_fleet(model: str, requests: int, rate: float, *serve_args: str) -> dict:
    import subprocess

    args = ("--prefill", "1", "--decode", "2", "--devices", "cpu:0,cpu:1,cpu:2", "--no-access-log", *serve_args)
    with local_fleet(model, *args) as url:
        subprocess.run([*FLEETCTL, "bench", "--url", url, "--requests", "2", "--rate", "0", "--json"],
                       capture_output=True, check=True)  # warm-up: first steps, calibration
        out = subprocess.run([*FLEETCTL, "bench", "--url", url, "--trace", "chat", "--requests", str(requests),
                              "--rate", str(rate), "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument("--sizes-mib", default="1,16,64")
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args()
    report = {"handoff": handoff_rates([int(s) for s in opts.sizes_mib.split(",")])}
    local = bench_fleet(opts.model, opts.requests, opts.rate)
    on_ray = bench_fleet(opts.model, opts.requests, opts.rate, "--ray", "auto")
    report["latency"] = {name: {key: run[key] for key in ("ttft_s", "tpot_s", "e2e_s", "errors")}
                         for name, run in (("local", local), ("ray", on_ray))}
    report["latency"]["ray_over_local_p50"] = {
        key: round(on_ray[key]["p50"] / local[key]["p50"], 3) if local[key]["p50"] else None
        for key in ("ttft_s", "tpot_s", "e2e_s")}
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
              f"E2E p50 {run['e2e_s']['p50']:.4f} s  errors {run['errors']}")
    print("ray / local p50:", report["latency"]["ray_over_local_p50"], file=sys.stdout)


if __name__ == "__main__":
    main()
