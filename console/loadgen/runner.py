"""The load generator behind `fleetctl bench`: a trace sent against a running fleet. Streams every request (SSE) to
measure TTFT / TPOT / E2E at the client, and reads the fleet's own KV-handoff time from /metrics.
Options a vLLM user expects: fixed input/output lengths (`--input-len`: prompts of exactly that many
tokens, cut from random words tokenized by the fleet's /tokenize and sent as token ids), a cap on
requests in flight, warm-up requests that are not measured, and a progress callback. A session's turns
go one after another, each prompt the previous turn's prompt and answer plus its own (or, with `bench --tools` /
`--response-format`, chat requests with the conversation so far: agent_tools.py, chat_stream.py)."""

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from functools import partial

import httpx
from prometheus_client.parser import text_string_to_metric_families

from fleetctl.console.loadgen.agent_tools import AgentApi, Conversation
from fleetctl.console.loadgen.chat_stream import send_chat
from fleetctl.console.loadgen.outcome import Outcome, constrained_summary, http_error_text, percentile_json
from fleetctl.console.loadgen.requests import WORDS, TraceRequest

Progress = Callable[[str, int, int], None]  # (stage, done, total)


async def stream_request(http: httpx.AsyncClient, model: str, req: TraceRequest, start: float) -> Outcome:
    """One streamed completion sent at `start + req.arrival_s` (perf_counter time), timed at the client."""
    await asyncio.sleep(max(0.0, start + req.arrival_s - time.perf_counter()))
    return await _send(http, model, req)


async def _send(http: httpx.AsyncClient, model: str, req: TraceRequest) -> Outcome:
    sent = time.perf_counter()
    out = Outcome(turn=req.turn)
    body = {"model": model, "prompt": list(req.prompt_token_ids) or req.prompt, "max_tokens": req.max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    if req.session_id is not None:
        body["user"] = req.session_id  # the fleet keeps a session's KV for --session-ttl
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
                    out.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    out.completion_tokens = chunk["usage"]["completion_tokens"]
    except httpx.HTTPError as exc:
        out.error = http_error_text(exc)
    out.e2e_s = time.perf_counter() - sent
    return out


async def fixed_lengths(http: httpx.AsyncClient, trace: list[TraceRequest], input_len: int | None,
                        output_len: int | None, seed: int = 0) -> list[TraceRequest]:
    """The trace's arrivals with every prompt exactly `input_len` tokens (random words, tokenized by the
    fleet, cut to length) and every output `output_len` tokens; None keeps the trace's own."""
    rng = random.Random(seed)
    fixed = []
    for req in trace:
        if input_len:
            req = replace(req, prompt="", prompt_words=input_len,
                          prompt_token_ids=tuple(await _random_tokens(http, rng, input_len)))
        fixed.append(replace(req, max_tokens=output_len) if output_len else req)
    return fixed


async def _random_tokens(http: httpx.AsyncClient, rng: random.Random, count: int) -> list[int]:
    words: list[str] = []
    tokens: list[int] = []
    while len(tokens) < count:
        words += [rng.choice(WORDS) for _ in range(count - len(tokens) + 8)]
        response = await http.post("/tokenize", json={"prompt": " ".join(words)})
        response.raise_for_status()
        tokens = response.json()["tokens"]
    return tokens[:count]


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


async def send_trace(http: httpx.AsyncClient, model: str, trace: list[TraceRequest], cap: int = 0,
                     stage: str = "requests", progress: Progress | None = None, paced: bool = True,
                     api: AgentApi = AgentApi.COMPLETIONS) -> list[Outcome]:
    """Every request at its arrival time (or at once), at most `cap` in flight (0: no cap). A session's turns
    go in order, each sent once the previous one ended and its `pause_s` passed (and not before its own arrival),
    its prompt appended to that turn's prompt and answer (or, with a chat `api`, the conversation so far:
    agent_tools.py); a turn that fails ends its session (the turns left count as errors)."""
    gate = asyncio.Semaphore(cap) if cap else None
    done = 0
    start = time.perf_counter()

    def finished(out: Outcome) -> Outcome:
        nonlocal done
        done += 1
        if progress:
            progress(stage, done, len(trace))
        return out

    async def one(req: TraceRequest, send: Callable[[], Awaitable[Outcome]]) -> Outcome:
        if paced:
            await asyncio.sleep(max(0.0, start + req.arrival_s - time.perf_counter()))
        async with gate or contextlib.nullcontext():
            sent = time.perf_counter()
            out = await send()
        out.start_s = sent - start
        return finished(out)

    async def session(turns: list[TraceRequest]) -> list[Outcome]:
        outcomes: list[Outcome] = []
        history = ""
        chat = Conversation(api, model) if api is not AgentApi.COMPLETIONS else None
        ordered = sorted(turns, key=lambda r: r.turn)
        for req in ordered:
            if outcomes and outcomes[-1].error:
                outcomes.append(finished(Outcome(error="an earlier turn of its session failed", turn=req.turn)))
                continue
            if outcomes and req.pause_s:
                await asyncio.sleep(req.pause_s)  # the tool the previous turn called runs
            if chat is None:
                out = await one(req, partial(_send, http, model, replace(req, prompt=history + req.prompt)))
                history += req.prompt + out.text
            else:
                out = await one(req, partial(send_chat, http, chat.body(req, last=req is ordered[-1]), req.turn))
                chat.answered(out)
            outcomes.append(out)
        return outcomes

    sessions: dict[str, list[TraceRequest]] = {}
    for req in trace:
        if req.session_id is not None:
            sessions.setdefault(req.session_id, []).append(req)
    if progress:
        progress(stage, 0, len(trace))
    results = await asyncio.gather(*(one(r, partial(_send, http, model, r)) for r in trace if r.session_id is None),
                                   *(session(turns) for turns in sessions.values()))
    return [o for result in results for o in (result if isinstance(result, list) else [result])]


async def run_bench(url: str, trace: list[TraceRequest], trace_name: str, slo_ttft: float, slo_tpot: float, *,
                    max_concurrency: int = 0, warmup: int = 0, progress: Progress | None = None,
                    details: list[Outcome] | None = None, api: AgentApi = AgentApi.COMPLETIONS) -> dict:
    """The run's summary (`bench --json`); `details`, when given, receives every measured request's outcome.
    `api`: how sessions' turns are sent (agent_tools.py)."""
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600.0)) as http:
        model = (await http.get("/v1/models")).json()["data"][0]["id"]
        if warmup:
            await send_trace(http, model, trace[:warmup], max_concurrency, "warm-up", progress, paced=False, api=api)
        before = _metric_sums((await http.get("/metrics")).text)
        start = time.perf_counter()
        outcomes = await send_trace(http, model, trace, max_concurrency, "requests", progress, api=api)
        duration = time.perf_counter() - start
        after = _metric_sums((await http.get("/metrics")).text)
    if details is not None:
        details.extend(outcomes)
    ok = [o for o in outcomes if not o.error]
    good = [o for o in ok if o.ttft_s <= slo_ttft and o.tpot_s <= slo_tpot]
    e2e_total = after["fleet_e2e_request_latency_seconds_sum"] - before["fleet_e2e_request_latency_seconds_sum"]
    handoff_total = after["fleet_kv_handoff_seconds_sum"] - before["fleet_kv_handoff_seconds_sum"]
    output_tokens = sum(o.completion_tokens for o in ok)
    return {
        "trace": trace_name,
        "requests": len(trace),
        "duration_s": round(duration, 3),
        "throughput_tokens_per_s": round(output_tokens / duration, 2),  # output tokens (DESIGN's name)
        "goodput_rps": round(len(good) / duration, 4),
        "ttft_s": percentile_json([o.ttft_s for o in ok]),
        "tpot_s": percentile_json([o.tpot_s for o in ok]),
        "e2e_s": percentile_json([o.e2e_s for o in ok]),
        "handoff_share_of_e2e": round(handoff_total / e2e_total, 6) if e2e_total else 0.0,
        "errors": len(outcomes) - len(ok),
        "request_throughput_rps": round(len(ok) / duration, 4),
        "input_tokens_per_s": round(sum(o.prompt_tokens for o in ok) / duration, 2),
        "output_tokens_per_s": round(output_tokens / duration, 2),
        "input_tokens": sum(o.prompt_tokens for o in ok),
        "output_tokens": output_tokens,
        "good_requests": len(good),
        "slo": {"ttft_s": slo_ttft, "tpot_s": slo_tpot},
        "max_concurrency": max_concurrency or None,
        "warmup": warmup,
        **(turn_latencies(outcomes) if any(r.session_id is not None for r in trace) else {}),
        "agent_api": api.value,
        **constrained_summary(outcomes),
    }
