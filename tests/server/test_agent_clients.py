"""Real agent clients against a real fleet of the default model (smollm2-135m; its template has no tool support, so
calls take the generic JSON format): the OpenAI Agents SDK runs an agent with two function tools to its final
answer through chat completions and through /v1/responses chained by `previous_response_id`; LangChain's
`bind_tools` and `with_structured_output` get parsed objects; a later Responses turn prefills only what is new."""

import asyncio
import json
from pathlib import Path

import httpx
import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field
from support.fleet_harness import serve

pytestmark = [pytest.mark.slow, pytest.mark.fleet]

MODEL = "smollm2-135m"
SETTINGS = ModelSettings(temperature=0, max_tokens=80, parallel_tool_calls=False, tool_choice="required")


@pytest.fixture(scope="module")
def url(smollm2_dir: Path):
    set_tracing_disabled(True)  # the SDK would send its traces to OpenAI
    with serve(smollm2_dir, "--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1", "--kv-memory", "256",
               "--session-ttl", "300") as fleet_url:
        yield fleet_url


def agent_with_tools(model: object, called: list[tuple[str, str]]) -> Agent:
    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city now."""
        called.append(("get_weather", city))
        return f"Sunny and 21 C in {city}."

    @function_tool
    def get_time(city: str) -> str:
        """The local time in a city."""
        called.append(("get_time", city))
        return f"It is 14:05 in {city}."

    return Agent(name="assistant", instructions="Answer with what the tools say.", tools=[get_weather, get_time],
                 model=model, model_settings=SETTINGS)  # type: ignore[arg-type]


def test_the_agents_sdk_runs_a_two_tool_agent_to_its_answer_over_chat_and_responses(url: str) -> None:
    sent: list[dict] = []

    async def record(request: httpx.Request) -> None:
        if request.url.path.endswith("/responses"):
            sent.append(json.loads(request.content))

    async def run() -> None:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300,
                                    http_client=httpx.AsyncClient(event_hooks={"request": [record]}))
        for model, chained in ((OpenAIChatCompletionsModel(model=MODEL, openai_client=client), False),
                               (OpenAIResponsesModel(model=MODEL, openai_client=client), True)):
            called: list[tuple[str, str]] = []
            result = await Runner.run(agent_with_tools(model, called), "What is the weather in Paris?", max_turns=6,
                                      auto_previous_response_id=chained)
            assert called and called[0][0] in ("get_weather", "get_time") and "Paris" in called[0][1], called
            assert "Paris" in str(result.final_output), result.final_output
            kinds = [type(item).__name__ for item in result.new_items]
            assert kinds[:2] == ["ToolCallItem", "ToolCallOutputItem"] and kinds[-1] == "MessageOutputItem", kinds

    asyncio.run(run())
    assert len(sent) >= 2 and "previous_response_id" not in sent[0]
    later = sent[1]  # sends only what is new: the tool's output, after the kept conversation
    assert later["previous_response_id"] and [item["type"] for item in later["input"]] == ["function_call_output"]


class City(BaseModel):
    """A city and the country it is in."""

    city: str = Field(max_length=30)
    country: str = Field(max_length=30)


def test_langchain_binds_tools_and_gets_structured_output(url: str) -> None:
    @tool
    def get_weather(city: str) -> str:
        """The weather in a city now."""
        return "sunny"

    llm = ChatOpenAI(base_url=f"{url}/v1", api_key="unused", model=MODEL, temperature=0, max_tokens=60,
                     max_retries=0)
    named = llm.bind_tools([get_weather], tool_choice="get_weather", parallel_tool_calls=False).invoke(
        "What is the weather in Paris?")
    assert named.tool_calls and all(c["name"] == "get_weather" and set(c["args"]) == {"city"}
                                    for c in named.tool_calls), named
    for method in ("json_schema", "function_calling"):
        answer = llm.with_structured_output(City, method=method).invoke("Name a big city and its country.")
        assert isinstance(answer, City) and answer.city and answer.country, (method, answer)


def test_a_later_responses_turn_prefills_only_what_is_new(url: str) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
    context = "Paris has many museums and a long river. " * 40
    first = client.responses.create(model=MODEL, instructions="Be brief.", input=context + "What to see?",
                                    max_output_tokens=16, temperature=0)
    later = client.responses.create(model=MODEL, instructions="Be brief.", previous_response_id=first.id,
                                    input="And after that?", max_output_tokens=16, temperature=0)
    rows = {r["request_id"]: r for r in httpx.get(f"{url}/fleet/requests", params={"limit": 50},
                                                  timeout=10).json()["requests"]}
    turn = rows[later.id]
    assert turn["session"] == first.id  # the conversation's turns share one session: its KV was kept
    assert turn["prefill_cached_tokens"] >= rows[first.id]["prompt_tokens"] - 32, turn
    expired = httpx.post(f"{url}/v1/responses", json={"model": MODEL, "input": "x", "previous_response_id": "resp_0"},
                         timeout=10)
    assert expired.status_code == 404 and expired.json()["error"]["code"] == "previous_response_not_found"
