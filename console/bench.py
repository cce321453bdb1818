"""`fleetctl bench`: a load generator against a running fleet. Streams every request (SSE) to
measure TTFT / TPOT / E2E at the client, and reads the fleet's own KV-handoff time from /metrics."""

import asyncio
import json
import time
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from fleetctl.console.traces import TraceRequest
from fleetctl.store.queries import percentiles


@dataclass
class Outcome:
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    completion_tokens: int = 0
    error: str | None = None

    @property
    def tpot_s(self) -> float:
        return (self.e2e_s - self.ttft_s) / (self.completion_tokens - 1) if self.completion_tokens > 1 else 0.0


def percentile_json(values: list[float]) -> dict[str, float]:
    """{"p50", "p90", "p99"} in seconds (0.0 when nothing succeeded)."""
    cuts = percentiles(values)
    return {name: round(getattr(cuts, name) or 0.0, 5) for name in ("p50", "p90", "p99")}


async def stream_request(http: httpx.AsyncClient, model: str, req: TraceRequest, start: float) -> Outcome:
    """One streamed completion sent at `start + req.arrival_s` (perf_counter time), timed at the client."""
    await asyncio.sleep(max(0.0, start + req.arrival_s - time.perf_counter()))
    sent = time.perf_counter()
    out = Outcome()
    body = {"model": model, "prompt": req.prompt, "max_tokens": req.max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    try:
        async with http.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                out.error = f"HTTP {response.status_code}: {response.text[:200]}"
                return out
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    out.error = chunk["error"]["message"]
                elif chunk.get("choices") and not out.ttft_s:
                    out.ttft_s = time.perf_counter() - sent
                if chunk.get("usage"):
                    out.completion_tokens = chunk["usage"]["completion_tokens"]
    except httpx.HTTPError as exc:
        out.error = f"{exc.__class__.__name__}: {exc}"
    out.e2e_s = time.perf_counter() - sent
    return out


_SUMS = ("fleet_kv_handoff_seconds_sum", "fleet_e2e_request_latency_seconds_sum")


def _metric_sums(text: str) -> dict[str, float]:
    """The histogram sums bench compares before and after a run (summed over any labels)."""
    sums = dict.fromkeys(_SUMS, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in sums:
                sums[sample.name] += sample.value
    return sums


async def run_bench(url: str, trace: list[TraceRequest], trace_name: str, slo_ttft: float, slo_tpot: float) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600.0)) as http:
        model = (await http.get("/v1/models")).json()["data"][0]["id"]
        before = _metric_sums((await http.get("/metrics")).text)
        start = time.perf_counter()
        outcomes = await asyncio.gather(*[stream_request(http, model, r, start) for r in trace])
        duration = time.perf_counter() - start
        after = _metric_sums((await http.get("/metrics")).text)
    ok = [o for o in outcomes if not o.error]
    good = [o for o in ok if o.ttft_s <= slo_ttft and o.tpot_s <= slo_tpot]
    e2e_total = after["fleet_e2e_request_latency_seconds_sum"] - before["fleet_e2e_request_latency_seconds_sum"]
    handoff_total = after["fleet_kv_handoff_seconds_sum"] - before["fleet_kv_handoff_seconds_sum"]
    return {
        "trace": trace_name,
        "requests": len(trace),
        "duration_s": round(duration, 3),
        "throughput_tokens_per_s": round(sum(o.completion_tokens for o in ok) / duration, 2),
        "goodput_rps": round(len(good) / duration, 4),
        "ttft_s": percentile_json([o.ttft_s for o in ok]),
        "tpot_s": percentile_json([o.tpot_s for o in ok]),
        "e2e_s": percentile_json([o.e2e_s for o in ok]),
        "handoff_share_of_e2e": round(handoff_total / e2e_total, 6) if e2e_total else 0.0,
        "errors": len(outcomes) - len(ok),
    }
