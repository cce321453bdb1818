"""Time out of service for a role change: a switch in place (`fleetctl switch`, the same process) against a
restart (stop the worker, start one of the other role on its device: the model loaded again), in the same run,
on one fleet (smollm2 by default, 1 prefill + 2 decode on CPU slots). Each round moves the fleet 1:2 → 2:1 → 1:2
with `rebalance --via switch`, then with `--via restart`, while `--streams` sessions decode (so a decode
worker's sessions move live before it changes role); it prints each change's seconds, the restart's model-load
share (the new process's load time, from its `start` event), sessions lost, and the ratio switch / restart.

    python scripts/bench_switch.py [--model smollm2-135m] [--rounds 2] [--streams 4]
"""

import argparse
import asyncio
import statistics
import threading
import time

import httpx

from fleetctl.console.cli.models import resolve_model
from fleetctl.console.loadgen.local_fleet import local_fleet
from fleetctl.engine.api.admin_token import read_admin_token


class Sessions:
    """Streams that decode until stopped; how many ended in an error."""

    def __init__(self, url: str, model: str, count: int) -> None:
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._run(url, model, count),))
        self._thread.start()

    async def _run(self, url: str, model: str, count: int) -> None:
        async def one(http: httpx.AsyncClient, i: int) -> None:
            while not self._stop.is_set():
                body = {"model": model, "prompt": f"Session {i} keeps talking about", "max_tokens": 96,
                        "temperature": 0, "ignore_eos": True, "stream": True}
                async with http.stream("POST", "/v1/completions", json=body) as response:
                    async for line in response.aiter_lines():
                        self.errors += '"error"' in line
                        if self._stop.is_set():
                            return

        async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(3600.0)) as http:
            await asyncio.gather(*[one(http, i) for i in range(count)])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def rebalance(url: str, split: str, via: str) -> dict:
    headers = {"Authorization": f"Bearer {read_admin_token()}"}
    op = httpx.post(f"{url}/fleet/rebalance", json={"split": split, "apply": True, "via": via}, headers=headers,
                    timeout=60).json()
    while op["state"] == "running":
        time.sleep(0.05)
        op = httpx.get(f"{url}/fleet/operations/{op['id']}", timeout=60).json()
    if op["state"] != "done":
        raise SystemExit(f"rebalance to {split} via {via} failed: {op['error']}")
    return op["result"]


def load_seconds(url: str, worker: str) -> float | None:
    """The model-load seconds of `worker`'s process, from its start event in the store (None: not found)."""
    events = httpx.get(f"{url}/fleet/history", params={"since": 3600}, timeout=60).json()["events"]
    loads = [e["details"].get("load_s") for e in events if e["kind"] == "start" and e["worker"] == worker]
    return next((load for load in reversed(loads) if load is not None), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--streams", type=int, default=4)
    args = parser.parse_args()
    model = resolve_model(args.model)
    layout = ("--prefill", "1", "--decode", "2", "--devices", "cpu:0,cpu:1,cpu:2")
    seconds: dict[str, list[float]] = {"switch": [], "restart": []}
    loads: list[float] = []
    with local_fleet(model, *layout) as url:
        served = httpx.get(f"{url}/v1/models", timeout=60).json()["data"][0]["id"]
        sessions = Sessions(url, served, args.streams)
        try:
            time.sleep(5)  # the sessions decoding on both decode workers
            for n in range(args.rounds):
                for via in ("switch", "restart"):
                    for split in ("2:1", "1:2"):
                        result = rebalance(url, split, via)
                        for move in result["moves"]:
                            seconds[via].append(move["seconds"])
                            load = load_seconds(url, move["new_worker"]) if via == "restart" else None
                            if load is not None:
                                loads.append(load)
                            print(f"round {n + 1} via {via:7} {move['worker']:>9} -> {move['new_worker']:<9} "
                                  f"{move['seconds']:7.3f} s  moved {move['sessions_moved']} "
                                  f"finished {move['sessions_finished']}", flush=True)
        finally:
            sessions.stop()
    switch, restart = statistics.median(seconds["switch"]), statistics.median(seconds["restart"])
    load = f"{statistics.median(loads):.2f} s" if loads else "not in the events"
    worst = max(seconds["switch"])
    print(f"median out of service: switch {switch:.3f} s, restart {restart:.3f} s (model load {load}); "
          f"switch/restart {switch / restart:.2g}x, the slowest switch (sessions moving off it first) {worst:.3f} s = "
          f"{worst / restart:.2g}x; streams that ended in an error: {sessions.errors}")


if __name__ == "__main__":
    main()
