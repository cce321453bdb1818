"""Synthetic agent sessions (agent_sessions.py) spoken through the chat API, as an agent framework speaks it:
`bench --tools` turns the shared system prompt's four tools into OpenAI function tools with real JSON schemas,
and each turn is a chat request with the conversation so far (system, the task, then per earlier turn the
assistant's call and a `tool` message with its result); `bench --response-format` asks each turn instead for a
ReAct step as `response_format` json_schema, its observations sent as user turns. A session's last turn is the
final answer, unconstrained (`tool_choice: none`). Constrained turns end where their JSON does (no `ignore_eos`),
within a token budget above the longest valid answer; free turns keep the trace's lengths."""

from enum import StrEnum
from typing import Any

from fleetctl.console.loadgen.agent_sessions import TASK, TOOL_NAMES, first_turn_parts, observation_of
from fleetctl.console.loadgen.outcome import Outcome
from fleetctl.console.loadgen.requests import TraceRequest


class AgentApi(StrEnum):
    COMPLETIONS = "completions"  # the whole conversation re-sent as one prompt (the default)
    TOOLS = "tools"  # chat with function tools: `tool_choice: required`, then `none` for the final answer
    RESPONSE_FORMAT = "response_format"  # chat whose steps are JSON of REACT_STEP


def _text(max_length: int) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "maxLength": max_length}


def _integer(minimum: int, maximum: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": minimum, "maximum": maximum}


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


# each tool's arguments; string bounds keep every valid call short enough to end within CONSTRAINED_MAX_TOKENS
TOOL_PARAMETERS: dict[str, dict[str, Any]] = {
    "search": _object({"query": _text(64), "max_results": _integer(1, 20),
                       "sources": {"type": "array", "items": {"enum": ["web", "docs", "code"]}, "minItems": 1,
                                   "maxItems": 3}}, ["query", "max_results"]),
    "read": _object({"path": _text(64), "start_line": _integer(1, 100_000), "line_count": _integer(1, 500)},
                    ["path"]),
    "run": _object({"command": _text(96), "timeout_s": _integer(1, 600), "shell": {"enum": ["bash", "python"]}},
                   ["command", "shell"]),
    "write": _object({"path": _text(64), "content": _text(160), "mode": {"enum": ["create", "append", "overwrite"]}},
                     ["path", "content", "mode"]),
}
PURPOSES = {"search": "Search the web, the docs or the code.", "read": "Read lines of a file.",
            "run": "Run a command and return its output.", "write": "Write text to a file."}
REACT_STEP: dict[str, Any] = _object({"thought": _text(160), "action": {"enum": list(TOOL_NAMES)},
                                      "input": _text(96)}, ["thought", "action", "input"])
# the longest valid answer of either kind is about 300 characters of JSON, and these plain-English answers take
# at least a character per token
CONSTRAINED_MAX_TOKENS = 384


def function_tools(descriptions: dict[str, str]) -> list[dict[str, Any]]:
    """The four tools as OpenAI function tools, each described by its purpose and the system prompt's text."""
    return [{"type": "function", "function": {"name": name, "description": f"{PURPOSES[name]} {descriptions[name]}",
                                              "parameters": TOOL_PARAMETERS[name]}} for name in TOOL_NAMES]


def react_format() -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "react_step", "schema": REACT_STEP, "strict": True}}


class Conversation:
    """One agent session's chat: the messages so far, each turn's request body, and the answers appended."""

    def __init__(self, api: AgentApi, model: str) -> None:
        self.api = api
        self.model = model
        self.messages: list[dict[str, Any]] = []
        self.tools: list[dict[str, Any]] = []

    def _start(self, prompt: str) -> None:
        prose, descriptions, task = first_turn_parts(prompt)
        if self.api is AgentApi.TOOLS:
            self.tools = function_tools(descriptions)
            system = prose
        else:  # the tools stay described in the system prompt, as the completions trace has them
            system = prompt.partition(TASK)[0].strip()
        self.messages = [{"role": "system", "content": system}, {"role": "user", "content": task}]

    def _observe(self, result: str) -> None:
        """The previous turn's tool result: a `tool` message answering its call, else a user turn."""
        calls = self.messages[-1].get("tool_calls") if self.messages[-1]["role"] == "assistant" else None
        if calls:
            self.messages.append({"role": "tool", "tool_call_id": calls[0]["id"], "content": result})
        else:
            self.messages.append({"role": "user", "content": f"Observation: {result}"})

    def body(self, req: TraceRequest, last: bool) -> dict[str, Any]:
        """The chat request of turn `req` (`last`: the session's final answer) with the conversation so far."""
        if req.turn == 0:
            self._start(req.prompt)
        else:
            self._observe(observation_of(req.prompt))
        body: dict[str, Any] = {"model": self.model, "messages": list(self.messages), "temperature": 0,
                                "stream": True, "stream_options": {"include_usage": True}}
        if req.session_id is not None:
            body["user"] = req.session_id  # the fleet keeps a session's KV for --session-ttl
        if self.tools:  # the last turn too, so that its prompt is the conversation's
            body |= {"tools": self.tools, "tool_choice": "none" if last else "required", "parallel_tool_calls": False}
        if last:
            return body | {"max_tokens": req.max_tokens, "ignore_eos": True}
        if self.api is AgentApi.RESPONSE_FORMAT:
            body["response_format"] = react_format()
        return body | {"max_tokens": CONSTRAINED_MAX_TOKENS}

    def answered(self, out: Outcome) -> None:
        """The turn's answer as the assistant's message: its call (one: `parallel_tool_calls` is off), else its
        text."""
        if out.tool_calls:
            self.messages.append({"role": "assistant", "content": None, "tool_calls": list(out.tool_calls[:1])})
        else:
            self.messages.append({"role": "assistant", "content": out.text})
