"""One streamed chat request of an agent session (agent_tools.py), timed at the client as completions are: TTFT at
the first chunk after the opening role chunk, TPOT from the usage chunk's token count. Tool calls are gathered
from `delta.tool_calls` (the fleet sends each whole in the last chunk; pieces by `index` are joined, as OpenAI
streams them). A constrained answer is then checked against the schema its request asked for: every call's
arguments under its tool's parameters, or the content under `response_format`'s schema."""

import json
import time
from typing import Any

import httpx

from fleetctl.console.loadgen.outcome import Outcome, http_error_text
from fleetctl.console.loadgen.schema_check import violation


def constrained(body: dict[str, Any]) -> bool:
    """Whether the request holds its answer to a schema: tool calls required (or one named), or a JSON schema."""
    choice = body.get("tool_choice", "auto")
    calls = bool(body.get("tools")) and (choice == "required" or isinstance(choice, dict))
    return calls or body.get("response_format", {}).get("type") == "json_schema"


def schema_problem(body: dict[str, Any], content: str, calls: tuple[dict, ...]) -> str | None:
    """How a constrained answer departs from the schema asked (None: valid). No call, or JSON that does not
    parse, is a departure."""
    if body.get("response_format", {}).get("type") == "json_schema":
        return _json_problem(content, body["response_format"]["json_schema"]["schema"], "content")
    if not calls:
        return "no tool call"
    schemas = {t["function"]["name"]: t["function"].get("parameters", {}) for t in body["tools"]}
    for call in calls:
        name = call.get("function", {}).get("name")
        if name not in schemas:
            return f"a call of {name!r}, which is not one of the tools"
        if problem := _json_problem(call["function"].get("arguments", ""), schemas[name], f"{name} arguments"):
            return problem
    return None


def _json_problem(text: str, schema: dict[str, Any], what: str) -> str | None:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"{what} are not JSON: {exc}"
    problem = violation(value, schema)
    return f"{what}: {problem}" if problem else None


def _join_calls(calls: dict[int, dict], pieces: list[dict]) -> None:
    """Add a chunk's `delta.tool_calls` pieces to the calls so far, by index."""
    for piece in pieces:
        call = calls.setdefault(piece.get("index", 0), {"id": "", "type": "function",
                                                        "function": {"name": "", "arguments": ""}})
        call["id"] = piece.get("id") or call["id"]
        function = piece.get("function") or {}
        call["function"]["name"] += function.get("name") or ""
        call["function"]["arguments"] += function.get("arguments") or ""


async def send_chat(http: httpx.AsyncClient, body: dict[str, Any], turn: int) -> Outcome:
    """The streamed chat request `body` (its `stream_options.include_usage` set), timed at the client."""
    sent = time.perf_counter()
    out = Outcome(turn=turn, constrained=constrained(body))
    calls: dict[int, dict] = {}
    try:
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
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
                    delta = chunk["choices"][0].get("delta") or {}
                    if "role" not in delta:  # the opening chunk comes before any token
                        out.ttft_s = out.ttft_s or time.perf_counter() - sent
                    out.text += delta.get("content") or ""
                    _join_calls(calls, delta.get("tool_calls") or [])
                if chunk.get("usage"):
                    out.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    out.completion_tokens = chunk["usage"]["completion_tokens"]
    except httpx.HTTPError as exc:
        out.error = http_error_text(exc)
    out.e2e_s = time.perf_counter() - sent
    out.tool_calls = tuple(calls[i] for i in sorted(calls))
    if out.constrained and not out.error:
        out.schema_problem = schema_problem(body, out.text, out.tool_calls)
    return out
