"""Speculative decoding in a real fleet (tiny model, `--deterministic`, `--speculative ngram`): a decode worker's
steps verify drafts — several tokens of one stream in one step report — and every completion, streamed or not,
equals `fleetctl generate`'s without speculation; /metrics counts the drafts."""

import asyncio
import re
from pathlib import Path

import httpx
import openai
import pytest
from support.fleet_harness import generate_json, serve

pytestmark = pytest.mark.fleet

PROMPTS = ["a b c d e f a b c d e f a b c", "one two three one two three one", "x y x y x y x"]
FLAGS = ("--dtype", "float32", "--deterministic", "--kv-blocks", "256")


async def complete_all(url: str) -> list[str]:
    api = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)

    async def streamed(prompt: str) -> str:
        stream = await api.completions.create(model="m", prompt=prompt, max_tokens=40, temperature=0, stream=True)
        return "".join([chunk.choices[0].text async for chunk in stream])

    whole = await asyncio.gather(*(api.completions.create(model="m", prompt=p, max_tokens=40, temperature=0)
                                   for p in PROMPTS))
    return [d.choices[0].text for d in whole] + list(await asyncio.gather(*(streamed(p) for p in PROMPTS)))


def test_speculated_completions_are_generates_own(tiny_model_dir: Path) -> None:
    reference = [r["text"] for r in generate_json(tiny_model_dir, PROMPTS, *FLAGS, "--max-tokens", "40")]
    with serve(tiny_model_dir, "--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1",
               "--served-model-name", "m", "--speculative", "ngram", "--speculative-tokens", "6", *FLAGS) as url:
        assert asyncio.run(complete_all(url)) == reference * 2
        metrics = httpx.get(f"{url}/metrics").text
    drafted = re.search(r'vllm:spec_decode_num_draft_tokens_total\{role="decode",worker="decode-0"\} (\S+)', metrics)
    accepted = re.search(r'vllm:spec_decode_num_accepted_tokens_total\{role="decode",worker="decode-0"\} (\S+)',
                         metrics)
    assert drafted and accepted and float(drafted[1]) >= float(accepted[1]) > 0
