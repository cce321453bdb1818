"""The fleet on the default model (smollm2-135m): one prefill and two decode workers on CPU slots.

Token identity relies on `--deterministic` on both sides (fleet and `fleetctl generate`)."""

from pathlib import Path

import openai
import pytest
from fleet_harness import generate_json, serve

pytestmark = [pytest.mark.slow, pytest.mark.fleet]

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Three primary colors are"]


def test_smollm2_fleet_matches_generate(smollm2_dir: Path) -> None:
    reference = generate_json(smollm2_dir, PROMPTS, "--dtype", "float32", "--deterministic", "--max-tokens", "16")
    with serve(smollm2_dir, "--prefill", "1", "--decode", "2", "--devices", "cpu:0,cpu:1,cpu:2", "--dtype",
               "float32", "--deterministic", "--kv-memory", "256") as url:
        api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
        for prompt, ref in zip(PROMPTS, reference, strict=True):
            done = api.completions.create(model="smollm2-135m", prompt=prompt, max_tokens=16, temperature=0)
            assert done.choices[0].text == ref["text"]
            streamed = "".join(c.choices[0].text for c in api.completions.create(
                model="smollm2-135m", prompt=prompt, max_tokens=16, temperature=0, stream=True) if c.choices)
            assert streamed == ref["text"]
        chat = api.chat.completions.create(
            model="smollm2-135m", messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=16, temperature=0)
        assert "Paris" in chat.choices[0].message.content
