"""Load on a real fleet (1 prefill + 2 decode, tiny model): 64 streaming clients, each sending one request after
another for a bounded time, far past what the fleet serves at once. Past capacity a request is refused with
429 and a Retry-After; none hangs, none gets a 5xx or ends with an error, and the controller's memory is flat
once warm (its live numbers are bounded windows, and the finished requests it keeps, `--kept-requests`, are full
by then)."""

import asyncio
import json
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil
import pytest
from support.fleet_harness import serve

pytestmark = pytest.mark.fleet  # real worker processes and a real server

CLIENTS, WARM_S, MEASURED_S = 64, 8.0, 24.0
REQUEST_BOUND_S = 60.0
FLEET = ("--prefill", "1", "--decode", "2", "--devices", "cpu:0,cpu:1,cpu:2", "--dtype", "float32",
         "--kv-blocks", "64", "--max-num-seqs", "8", "--max-queue", "8", "--no-access-log",
         "--kept-requests", "500")  # fewer than the warm-up finishes: the records kept are full before RSS is read


async def client(url: str, model: str, index: int, stop_at: float, outcomes: Counter, retry_after: set) -> None:
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, read=REQUEST_BOUND_S)) as http:
        n = 0
        while time.monotonic() < stop_at:
            n += 1
            body = {"model": model, "prompt": f"client {index} request {n}", "max_tokens": 16 + (index * 7 + n) % 48,
                    "stream": True, "ignore_eos": True}
            try:
                async with asyncio.timeout(REQUEST_BOUND_S), http.stream("POST", f"{url}/v1/completions",
                                                                         json=body) as response:
                    if response.status_code == 429:
                        outcomes["429"] += 1
                        retry_after.add(response.headers.get("retry-after"))
                        await asyncio.sleep(float(response.headers.get("retry-after", "1")) * (0.5 + index / CLIENTS))
                        continue
                    if response.status_code != 200:
                        outcomes[f"http {response.status_code}"] += 1
                        continue
                    lines = [line async for line in response.aiter_lines() if line.startswith("data: ")]
            except (TimeoutError, httpx.HTTPError) as exc:
                outcomes[f"lost: {type(exc).__name__}"] += 1
                continue
            errors = [line for line in lines[:-1] if "error" in json.loads(line.removeprefix("data: "))]
            outcomes["completed" if lines and lines[-1] == "data: [DONE]" and not errors else "ended badly"] += 1


def test_many_streaming_clients_get_served_or_429_never_a_hang_or_5xx(tiny_model_dir: Path) -> None:
    with serve(tiny_model_dir, *FLEET) as url:
        status = httpx.get(f"{url}/fleet/status", timeout=10).json()
        controller = psutil.Process(status["pid"])
        model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
        outcomes: Counter = Counter()
        retry_after: set = set()
        rss: list[int] = []

        async def run() -> None:
            start = time.monotonic()
            stop_at = start + WARM_S + MEASURED_S
            clients = [asyncio.create_task(client(url, model, i, stop_at, outcomes, retry_after))
                       for i in range(CLIENTS)]
            await asyncio.sleep(WARM_S)
            rss.append(controller.memory_info().rss)
            await asyncio.gather(*clients)
            rss.append(controller.memory_info().rss)

        asyncio.run(run())
        print(f"load: {CLIENTS} clients, {WARM_S + MEASURED_S:g} s: {dict(outcomes)}; controller RSS "
              f"{rss[0] / 2**20:.1f} MiB warm -> {rss[1] / 2**20:.1f} MiB after")
        assert set(outcomes) == {"completed", "429"}, outcomes  # nothing lost, no 5xx, no error
        assert outcomes["completed"] >= CLIENTS and outcomes["429"] > 0
        assert retry_after == {"1"}
        assert rss[1] - rss[0] < 24 * 2**20, rss  # flat once warm (bounded windows, no per-request leftovers)
        health = httpx.get(f"{url}/health", timeout=10)
        assert health.status_code == 200
        workers = httpx.get(f"{url}/fleet/workers", timeout=10).json()["workers"]
        assert all(w["state"] == "running" and w["free_blocks"] == w["kv_blocks"] for w in workers)
