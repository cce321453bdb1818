"""Tool calls on the default model (smollm2-135m, whose template has no tool support: the generic JSON format)
through a real fleet: `tool_choice: required` at temperature 1.0 gives a valid call of the tool's schema for
every seed, and the `openai` client reads a streamed call."""

import asyncio
import json
from pathlib import Path

import openai
import pytest
from support.fleet_harness import serve

pytestmark = [pytest.mark.slow, pytest.mark.fleet]

MODEL = "smollm2-135m"
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                           "unit": {"enum": ["celsius", "fahrenheit"]}},
          "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city now",
                                           "parameters": SCHEMA}}]
MESSAGES = [{"role": "user", "content": "What is the weather like in Paris?"}]
SEEDS = range(20)


def valid_arguments(arguments: str) -> bool:
    value = json.loads(arguments)
    return (set(value) == {"city", "unit"} and isinstance(value["city"], str) and len(value["city"]) <= 20
            and value["unit"] in ("celsius", "fahrenheit"))


@pytest.fixture(scope="module")
def url(smollm2_dir: Path):
    with serve(smollm2_dir, "--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1",
               "--kv-memory", "256") as fleet_url:
        yield fleet_url


def test_required_calls_are_valid_for_every_seed(url: str) -> None:
    api = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)

    async def one(seed: int):
        return await api.chat.completions.create(
            model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
            temperature=1.0, seed=seed, max_tokens=120)

    async def every() -> list:
        return await asyncio.gather(*(one(seed) for seed in SEEDS))

    for done in asyncio.run(every()):
        choice = done.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.content is None and len(choice.message.tool_calls) == 1
        call = choice.message.tool_calls[0]
        assert call.id.startswith("call_") and call.function.name == "get_weather"
        assert valid_arguments(call.function.arguments), call.function.arguments


def test_a_streamed_named_call(url: str) -> None:
    api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
    chunks = list(api.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice={"type": "function", "function": {
            "name": "get_weather"}}, temperature=1.0, seed=7, max_tokens=160, stream=True))
    calls = [call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or []]
    assert calls and all(call.function.name == "get_weather" for call in calls)
    assert all(valid_arguments(call.function.arguments) for call in calls)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
