"""A burst far past a fleet's `--max-queue`: many completions (streamed and not) sent at once, each answer sorted
by status, the 429s checked for a `Retry-After` of whole seconds and the API's error body, the TTFT of the
streamed ones that were admitted measured at the client, and /health polled while the burst is on. Used by
scripts/burst.py and the overload tests."""

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

HEALTH_EVERY_S = 0.05


@dataclass
class BurstResult:
    statuses: Counter[int] = field(default_factory=Counter)  # HTTP status -> answers
    unclear_refusals: list[str] = field(default_factory=list)  # 429s without a Retry-After >= 1 or an error body
    stream_errors: list[str] = field(default_factory=list)  # admitted streams that ended without [DONE]
    ttft_s: list[float] = field(default_factory=list)  # the admitted streams', at the client
    health_s: list[float] = field(default_factory=list)  # each /health call's latency while the burst was on
    health_statuses: Counter[int] = field(default_factory=Counter)

    @property
    def server_errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status >= 500)


def refusal_problem(response: httpx.Response) -> str | None:
    """What a 429 lacks to be a clear answer (None when it is one): a Retry-After of whole seconds, at least 1,
    and OpenAI's error body of type rate_limit_error."""
    retry_after = response.headers.get("retry-after", "")
    if not retry_after.isdigit() or int(retry_after) < 1:
        return f"Retry-After {retry_after!r}"
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return f"body {response.text[:120]!r}"
    if error.get("type") != "rate_limit_error" or not error.get("message"):
        return f"error {error!r}"
    return None


async def completion(http: httpx.AsyncClient, model: str, index: int, max_tokens: int, stream: bool,
                     result: BurstResult) -> None:
    body = {"model": model, "prompt": f"burst request {index}", "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": stream}
    sent = time.perf_counter()
    async with http.stream("POST", "/v1/completions", json=body) as response:
        result.statuses[response.status_code] += 1
        if response.status_code != 200:
            await response.aread()
            if response.status_code == 429 and (problem := refusal_problem(response)):
                result.unclear_refusals.append(problem)
            return
        if not stream:
            await response.aread()
            return
        first: float | None = None
        last = ""
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            last = line
            if first is None and line != "data: [DONE]" and json.loads(line[6:]).get("choices"):
                first = time.perf_counter() - sent
        if first is None or last != "data: [DONE]":
            result.stream_errors.append(last[:120])
        else:
            result.ttft_s.append(first)


async def poll_health(http: httpx.AsyncClient, until: asyncio.Event, result: BurstResult) -> None:
    while not until.is_set():
        sent = time.perf_counter()
        response = await http.get("/health")
        result.health_s.append(time.perf_counter() - sent)
        result.health_statuses[response.status_code] += 1
        await asyncio.sleep(HEALTH_EVERY_S)


async def burst(url: str, model: str, requests: int, max_tokens: int, streamed_share: float = 0.5,
                in_flight: int | None = None, timeout_s: float = 120.0) -> BurstResult:
    """`requests` completions (the first `streamed_share` of every ten streamed), each on its own connection:
    all at once, or at most `in_flight` at a time (an unloaded run to compare with); /health polled on another
    connection meanwhile."""
    result = BurstResult()
    gate = asyncio.Semaphore(in_flight or requests)  # not httpx's pool: a request's clock starts once it is sent
    limits = httpx.Limits(max_connections=requests, max_keepalive_connections=0)
    done = asyncio.Event()

    async def send(index: int) -> None:
        async with gate:
            await completion(http, model, index, max_tokens, index % 10 < streamed_share * 10, result)

    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout_s) as http, \
            httpx.AsyncClient(base_url=url, timeout=timeout_s) as health:
        poller = asyncio.create_task(poll_health(health, done, result))
        try:
            await asyncio.gather(*[send(i) for i in range(requests)])
        finally:
            done.set()
            await poller
    return result
