"""`fleetctl bench`: a load generator against a running fleet. Streams every request (SSE) to
measure TTFT / TPOT / E2E at the client, and reads the fleet's own KV-handoff time from /metrics.
A session's turns go one after another, each prompt the previous turn's prompt and answer plus its own."""

import asyncio
import json
import time
from dataclasses import dataclass, replace

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
    text: str = ""  # the answer (a session's next turn appends it)
    turn: int = 0  # the turn of its session (0 for a single request)

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
    out = Outcome(turn=req.turn)
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
                elif chunk.get("choices"):
                    out.ttft_s = out.ttft_s or time.perf_counter() - sent
                    out.text += chunk["choices"][0].get("text", "")
                if chunk.get("usage"):
                    out.completion_tokens = chunk["usage"]["completion_tokens"]
    except httpx.HTTPError as exc:
        out.error = f"{exc.__class__.__name__}: {exc}"
    out.e2e_s = time.perf_counter() - sent
    return out


async def send_trace(http: httpx.AsyncClient, model: str, trace: list[TraceRequest], start: float) -> list[Outcome]:
    """Every request of `trace` at its arrival time; a session's turns in order, each sent once the previous
    one ended (and not before its own arrival), its prompt appended to that turn's prompt and answer. A turn
    that fails ends its session: the turns left are counted as errors."""
    sessions: dict[str, list[TraceRequest]] = {}
    for req in trace:
        if req.session_id is not None:
            sessions.setdefault(req.session_id, []).append(req)

    async def session(turns: list[TraceRequest]) -> list[Outcome]:
        outcomes: list[Outcome] = []
        history = ""
        for req in sorted(turns, key=lambda r: r.turn):
            if outcomes and outcomes[-1].error:
                outcomes.append(Outcome(error="an earlier turn of its session failed", turn=req.turn))
                continue
            out = await stream_request(http, model, replace(req, prompt=history + req.prompt), start)
            history += req.prompt + out.text
            outcomes.append(out)
        return outcomes

    singles = [stream_request(http, model, r, start) for r in trace if r.session_id is None]
    done = await asyncio.gather(*singles, *(session(turns) for turns in sessions.values()))
    return [o for result in done for o in (result if isinstance(result, list) else [result])]


def turn_latencies(outcomes: list[Outcome]) -> dict[str, object]:
    """TTFT of sessions' first turns and of their later turns (a prefix cache serves those), for a trace
    with sessions."""
    first = [o.ttft_s for o in outcomes if not o.error and o.turn == 0]
    later = [o.ttft_s for o in outcomes if not o.error and o.turn > 0]
    return {"ttft_first_turn_s": percentile_json(first), "ttft_later_turns_s": percentile_json(later)}


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
        outcomes = await send_trace(http, model, trace, start)
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
        **(turn_latencies(outcomes) if any(r.session_id is not None for r in trace) else {}),
    }
