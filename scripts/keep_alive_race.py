"""Requests sent on pooled connections that sat idle for about httpx's keep-alive expiry (5 s): with the server
closing idle connections at the same 5 s (uvicorn's default), a request sent just as the server closed its
connection was reset — `ReadError('')`, the demo's empty error. `serve` now keeps idle connections for
`KEEP_ALIVE_S` (console/cli/serve.py).

    python scripts/keep_alive_race.py [--model smollm2-135m] [--clients 30] [--rounds 10]

Each client (its own httpx pool) sends a one-token completion, waits 4.97–5.03 s, and again; prints the errors by
kind. Measured on 2 cores: 3 of 300 reset with uvicorn's 5 s, 0 of 300 with 75 s (twice each).
"""

import argparse
import asyncio
import collections
import random

import httpx

from fleetctl.console.loadgen.local_fleet import local_fleet
from fleetctl.console.loadgen.outcome import http_error_text


async def client(url: str, model: str, seed: int, rounds: int, errors: list[str]) -> None:
    rng = random.Random(seed)
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        for _ in range(rounds):
            try:
                answer = await http.post("/v1/completions", json={"model": model, "prompt": "Hi", "max_tokens": 1})
                answer.raise_for_status()
            except httpx.HTTPError as exc:
                errors.append(http_error_text(exc))
            await asyncio.sleep(rng.uniform(4.97, 5.03))


async def race(url: str, model: str, clients: int, rounds: int) -> list[str]:
    errors: list[str] = []
    await asyncio.gather(*(client(url, model, seed, rounds, errors) for seed in range(clients)))
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    with local_fleet(args.model) as url:
        model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
        errors = asyncio.run(race(url, model, args.clients, args.rounds))
    print(f"{len(errors)} of {args.clients * args.rounds} requests failed: {collections.Counter(errors).most_common()}")


if __name__ == "__main__":
    main()
