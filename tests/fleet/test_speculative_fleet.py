"""Speculative decoding in real fleets (tiny model, `--deterministic`, `--speculative ngram`; the tiny model's
greedy output falls into loops, which prompt lookup drafts): a decode worker's steps verify drafts — several tokens
of one stream in one step report — and every completion, streamed or not, equals `fleetctl generate`'s without
speculation, through live moves mid-stream too (a session's drafts are per step: a move carries nothing new);
/metrics counts the drafts."""

import asyncio
import re
from pathlib import Path

import httpx
import openai
import pytest
from support.fleet_harness import Stream, generate_json, move_each_live, serve, start_streams

pytestmark = pytest.mark.fleet

PROMPTS = ["a b c d e f a b c d e f a b c", "one two three one two three one", "x y x y x y x"]
FLAGS = ("--dtype", "float32", "--deterministic", "--kv-blocks", "256")
SPECULATIVE = ("--served-model-name", "m", "--speculative", "ngram", *FLAGS)


async def complete_all(url: str) -> list[str]:
    api = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)

    async def streamed(prompt: str) -> str:
        stream = await api.completions.create(model="m", prompt=prompt, max_tokens=40, temperature=0, stream=True)
        return "".join([chunk.choices[0].text async for chunk in stream])

    whole = await asyncio.gather(*(api.completions.create(model="m", prompt=p, max_tokens=40, temperature=0)
                                   for p in PROMPTS))
    return [d.choices[0].text for d in whole] + list(await asyncio.gather(*(streamed(p) for p in PROMPTS)))


def spec_counts(url: str, worker: str) -> tuple[float, float]:
    """(draft tokens verified, of them kept) on `worker`, from /metrics."""
    metrics = httpx.get(f"{url}/metrics", timeout=10).text

    def count(name: str) -> float:
        found = re.search(rf'vllm:spec_decode_num_{name}_tokens_total\{{role="decode",worker="{worker}"\}} (\S+)',
                          metrics)
        return float(found[1]) if found else 0.0

    return count("draft"), count("accepted")


def test_speculated_completions_are_generates_own(tiny_model_dir: Path) -> None:
    reference = [r["text"] for r in generate_json(tiny_model_dir, PROMPTS, *FLAGS, "--max-tokens", "40")]
    with serve(tiny_model_dir, "--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1", *SPECULATIVE) as url:
        assert asyncio.run(complete_all(url)) == reference * 2
        drafted, kept = spec_counts(url, "decode-0")
        status = httpx.get(f"{url}/fleet/status", timeout=10).json()
    assert drafted >= kept > 0
    decode = next(w for w in status["workers"] if w["id"] == "decode-0")
    assert decode["spec_acceptance"] == round(kept / drafted, 4) == status["pools"]["decode"]["spec_acceptance"]
    assert decode["spec_tokens_per_step"] > 1
    prefill = next(w for w in status["workers"] if w["id"] == "prefill-0")
    assert prefill["spec_acceptance"] is None is prefill["spec_tokens_per_step"]


def test_sessions_moved_mid_speculation_stream_generates_own(tiny_model_dir: Path) -> None:
    tokens = 150
    reference = [r["text"] for r in generate_json(tiny_model_dir, PROMPTS, *FLAGS, "--max-tokens", str(tokens),
                                                  "--ignore-eos")]
    streams = [Stream(p, request_id=f"s{i}") for i, p in enumerate(PROMPTS)]
    # each step slowed (a fault point's stall), so the sessions are still decoding when they move
    with serve(tiny_model_dir, "--prefill", "1", "--decode", "2", "--devices", "cpu:0,cpu:1,cpu:2", *SPECULATIVE,
               env={"FLEET_FAULTS": "step=stall:0.05"}) as url:
        done = start_streams(url, streams, tokens, "m")
        move_each_live(url, [s.request_id for s in streams])
        assert done.result(timeout=300) == reference
        assert sum(spec_counts(url, w)[1] for w in ("decode-0", "decode-1")) > 0
        assert "fleet_migration_downtime_seconds_count 3.0" in httpx.get(f"{url}/metrics", timeout=10).text

