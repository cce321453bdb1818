"""Agent sessions through the chat API (`bench --tools` / `--response-format`): each turn's messages are the
conversation so far in order (system, task, then per turn the assistant's call and the `tool` message answering
it), constrained turns ask for calls or a JSON schema and end with their JSON, the last turn is free; a streamed
answer's calls are gathered and checked against the schema the request asked for."""

import asyncio
import json

import httpx

from fleetctl.console.loadgen.agent_sessions import agent_sessions, observation_of, system_parts
from fleetctl.console.loadgen.agent_tools import (
    CONSTRAINED_MAX_TOKENS,
    REACT_STEP,
    TOOL_PARAMETERS,
    AgentApi,
    Conversation,
)
from fleetctl.console.loadgen.chat_stream import schema_problem
from fleetctl.console.loadgen.outcome import Outcome
from fleetctl.console.loadgen.runner import send_trace


def call(name: str, arguments: dict, call_id: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


SESSION = agent_sessions(3, rate=0.0, seed=1, context=1024)  # one session's first three turns
READ = call("read", {"path": "a.py"}, "call_1")


def test_a_tools_session_sends_the_conversation_so_far_in_order() -> None:
    chat = Conversation(AgentApi.TOOLS, "m")
    first = chat.body(SESSION[0], last=False)
    prose, descriptions = system_parts(round(1536 / 8))
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert first["messages"][0]["content"] == prose and "Tool " not in prose
    assert SESSION[0].prompt.endswith(f"Task: {first['messages'][1]['content']}\n")
    assert [t["function"]["name"] for t in first["tools"]] == ["search", "read", "run", "write"]
    assert all(t["function"]["parameters"] == TOOL_PARAMETERS[t["function"]["name"]] for t in first["tools"])
    assert first["tools"][0]["function"]["description"].endswith(descriptions["search"])
    assert (first["tool_choice"], first["parallel_tool_calls"], first["max_tokens"]) == (
        "required", False, CONSTRAINED_MAX_TOKENS)
    assert "ignore_eos" not in first and first["user"] == "s0" and first["stream_options"] == {"include_usage": True}

    chat.answered(Outcome(tool_calls=(READ,)))
    second = chat.body(SESSION[1], last=False)
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool"]
    assert second["messages"][2] == {"role": "assistant", "content": None, "tool_calls": [READ]}
    assert second["messages"][3] == {"role": "tool", "tool_call_id": "call_1",
                                     "content": observation_of(SESSION[1].prompt)}
    assert "Observation" not in second["messages"][3]["content"] and first["messages"] == second["messages"][:2]

    chat.answered(Outcome(text="not a call"))  # a turn with no call: its result comes as a user turn
    last = chat.body(SESSION[2], last=True)
    assert [m["role"] for m in last["messages"]] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert last["messages"][4] == {"role": "assistant", "content": "not a call"}
    assert last["messages"][5]["content"] == f"Observation: {observation_of(SESSION[2].prompt)}"
    assert (last["tool_choice"], last["ignore_eos"], last["max_tokens"]) == ("none", True, SESSION[2].max_tokens)


def test_a_response_format_session_asks_for_react_steps_and_answers_freely_last() -> None:
    chat = Conversation(AgentApi.RESPONSE_FORMAT, "m")
    first = chat.body(SESSION[0], last=False)
    assert "tools" not in first and first["response_format"]["json_schema"]["schema"] == REACT_STEP
    assert "Tool search: " in first["messages"][0]["content"]  # the tools stay described in the system prompt
    step = '{"thought": "t", "action": "read", "input": "a.py"}'
    chat.answered(Outcome(text=step))
    last = chat.body(SESSION[1], last=True)
    assert last["messages"][2:] == [{"role": "assistant", "content": step},
                                    {"role": "user", "content": f"Observation: {observation_of(SESSION[1].prompt)}"}]
    assert "response_format" not in last and last["ignore_eos"] is True


def test_a_constrained_answer_is_checked_against_the_schema_its_request_asked() -> None:
    tools = Conversation(AgentApi.TOOLS, "m").body(SESSION[0], last=False)
    assert schema_problem(tools, "", (READ,)) is None
    assert schema_problem(tools, "hello", ()) == "no tool call"
    assert schema_problem(tools, "", (call("fly", {}, "c"),)) == "a call of 'fly', which is not one of the tools"
    assert schema_problem(tools, "", (call("read", {"path": "a", "mode": "x"}, "c"),)) == (
        "read arguments: $: 'mode' is not allowed")
    broken = {"id": "c", "function": {"name": "read", "arguments": '{"path": "a'}}
    assert schema_problem(tools, "", (broken,)).startswith("read arguments are not JSON")
    react = Conversation(AgentApi.RESPONSE_FORMAT, "m").body(SESSION[0], last=False)
    assert schema_problem(react, '{"thought": "t", "action": "run", "input": "ls"}', ()) is None
    assert schema_problem(react, '{"thought": "t", "action": "run"}', ()) == "content: $: 'input' is required"


def test_bench_streams_chat_turns_gathers_calls_and_rates_them() -> None:
    bodies: list[dict] = []

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        arguments = '{"path": "a.py"}' if len(bodies) == 1 else '{"path": 7}'
        pieces = [{"index": 0, "id": f"call_{len(bodies)}", "function": {"name": "read", "arguments": arguments[:5]}},
                  {"index": 0, "function": {"arguments": arguments[5:]}}]  # joined by index, as OpenAI streams
        deltas = [{"role": "assistant", "content": ""}, {}, {"tool_calls": pieces[:1]}, {"tool_calls": pieces[1:]}]
        if body["tool_choice"] == "none":
            deltas = [{"role": "assistant", "content": ""}, {"content": "done"}]
        chunks = [{"choices": [{"delta": d}]} for d in deltas]
        chunks.append({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": len(deltas) - 1}})
        text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})

    async def run() -> list[Outcome]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer), base_url="http://fleet") as http:
            return await send_trace(http, "m", SESSION, api=AgentApi.TOOLS)

    outcomes = asyncio.run(run())
    assert [b["tool_choice"] for b in bodies] == ["required", "required", "none"]
    assert bodies[1]["messages"][2]["tool_calls"][0]["function"] == {"name": "read", "arguments": '{"path": "a.py"}'}
    assert bodies[2]["messages"][4]["tool_calls"][0]["id"] == "call_2"
    assert [(o.constrained, o.schema_valid) for o in outcomes] == [(True, True), (True, False), (False, None)]
    assert outcomes[1].schema_problem == "read arguments: $.path: 7 is not of type string"
    assert outcomes[2].text == "done" and all(o.ttft_s > 0 and o.completion_tokens for o in outcomes)
