"""A conversation with tools for a chat template that has no tool support (GENERIC, llama.cpp's generic format):
the tools and the JSON answer format described in the system message (merged into the first one, or put first),
the assistant's earlier calls written as that JSON, and tool results as a user turn, which every template takes
(one that refuses a `tool` role included; results in a row share one turn)."""

import json
from typing import Any

from fleetctl.engine.server.openai_protocol import ChatMessage
from fleetctl.engine.server.tool_grammars import Tool

CALLS = '{"tool_calls": [{"name": <tool name>, "arguments": {<its arguments>}}]}'
RESPONSE = '{"response": "<your answer>"}'


def _compact(value: object) -> str:
    """One line of JSON, laid out as the grammar makes the model write it (response_format.JSON_LAYOUT)."""
    return json.dumps(value, ensure_ascii=False)


def instructions(tools: list[Tool], descriptions: dict[str, str], parallel: bool) -> str:
    """What the system message tells the model about its tools and how to answer. The same whatever the tool
    choice (the grammar holds each turn to its choice), so a conversation's turns share their prompt's prefix
    and a later turn finds the earlier ones' KV."""
    listed = [{"name": name, "description": descriptions.get(name, ""), "parameters": schema}
              for name, schema in tools]
    at_most = "" if parallel else " Call one tool at most."
    return (f"You have these tools (the parameters are JSON schemas of their arguments):\n{_compact(listed)}\n\n"
            f"Answer with one JSON object and nothing else: {CALLS} to call tools, or {RESPONSE} to answer "
            f"directly.{at_most}")


def _calls_text(message: ChatMessage) -> str:
    calls = message.tool_calls or []
    return _compact({"tool_calls": [{"name": c.function.name, "arguments": json.loads(c.function.arguments)}
                                    for c in calls]})


def generic_messages(messages: list[ChatMessage], system: str) -> list[dict[str, Any]]:
    """The conversation as plain role/content turns, `system` (instructions()) merged in first."""
    names = {call.id: call.function.name for m in messages for call in m.tool_calls or []}
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "tool":
            name = message.name or names.get(message.tool_call_id or "", "a tool")
            result = f"Result of {name} ({message.tool_call_id or 'call'}): {message.text()}"
            if out and out[-1].get("tool_results"):
                out[-1]["content"] += "\n" + result
            else:
                out.append({"role": "user", "content": result, "tool_results": True})
        elif message.role == "assistant" and message.tool_calls:
            out.append({"role": "assistant", "content": _calls_text(message)})
        else:
            out.append({"role": message.role, "content": message.text()})
    if out and out[0]["role"] == "system":
        out[0]["content"] = f"{out[0]['content']}\n\n{system}"
    else:
        out.insert(0, {"role": "system", "content": system})
    return [{"role": m["role"], "content": m["content"]} for m in out]
