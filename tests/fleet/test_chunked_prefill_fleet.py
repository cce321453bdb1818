"""Chunked prefill in real fleets (tiny model, `--deterministic`): with a 16-token step budget, long
prompts are prefilled a chunk per step on a prefill worker (then handed off) and on a mixed worker
(decoding other streams between the chunks); every completion equals `fleetctl generate`'s unchunked one."""

import asyncio
from pathlib import Path

import openai
import pytest
from support.fleet_harness import generate_json, serve

pytestmark = pytest.mark.fleet

PROMPTS = [" ".join(f"word{i % 17} of line {i}" for i in range(n)) for n in (12, 4, 20, 1)]
COMMON = ("--served-model-name", "m", "--dtype", "float32", "--deterministic", "--max-num-batched-tokens", "16",
          "--kv-blocks", "256")


async def complete_all(url: str) -> list[str]:
    api = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    done = await asyncio.gather(*(api.completions.create(model="m", prompt=p, max_tokens=12, temperature=0)
                                  for p in PROMPTS))
    return [d.choices[0].text for d in done]


@pytest.mark.parametrize("layout", [("--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1"),
                                    ("--colocated", "1", "--devices", "cpu:0")], ids=["disaggregated", "mixed"])
def test_chunked_prompts_complete_as_generate_does(tiny_model_dir: Path, layout: tuple[str, ...]) -> None:
    reference = [r["text"] for r in generate_json(tiny_model_dir, PROMPTS, "--dtype", "float32", "--deterministic",
                                                  "--max-tokens", "12")]
    with serve(tiny_model_dir, *layout, *COMMON) as url:
        assert asyncio.run(complete_all(url)) == reference
