"""One chat request's tool calling, from its `tools`, `tool_choice` and `parallel_tool_calls` and the model's chat
template: the prompt (tools handed to a template that speaks a tool format, or described in the system message of
one that does not: tool_prompt.py), the grammar its answers are sampled under (tool_grammars.py), and each answer
read back (tool_formats.py) as OpenAI's message or stream deltas with `tool_calls`. `tool_choice: none` renders
the tools but reads no calls (GENERIC's answer is then held to its plain-answer form and read back as content).
Streams show content as soon as it is sure to stay content; a call comes whole (its arguments in one piece) once
the answer has ended."""

import json
import uuid
from dataclasses import dataclass
from typing import Any

from llguidance import LLMatcher

from fleetctl.engine.fleet.facade import FleetFacade
from fleetctl.engine.server.openai_protocol import ChatRequest, NamedToolChoice, template_messages
from fleetctl.engine.server.response_format import Constraint
from fleetctl.engine.server.tool_formats import FORMATS, Answer, FunctionCall, ToolFamily, family_of
from fleetctl.engine.server.tool_grammars import TokenLiteral, Tool, ToolChoiceMode, tool_grammar
from fleetctl.engine.server.tool_prompt import generic_messages, instructions
from fleetctl.errors import UserError


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _call_json(call: FunctionCall) -> dict[str, Any]:
    return {"id": call_id(), "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def _finish(answer: Answer, reason: str) -> str:
    """`tool_calls` for an answer that called tools and ended by itself; a cut one stays `length`."""
    return "tool_calls" if answer.calls and reason == "stop" else reason


def token_literal(fleet: FleetFacade) -> TokenLiteral:
    """An opener as a Lark grammar names it: by id where the model has it as a special token (one the
    detokenizer drops, so it cannot be matched as text), else as text."""

    def literal(text: str) -> str:
        ids = fleet.encode(text)
        return f"<[{ids[-1]}]>" if ids and fleet.decode(ids) == "" else json.dumps(text)

    return literal


@dataclass
class _Stream:
    text: str = ""  # the answer so far
    shown: str = ""  # the content sent so far


class ToolCalling:
    def __init__(self, body: ChatRequest, template: str | None, literal: TokenLiteral) -> None:
        choice = body.tool_choice_mode
        self.mode = ToolChoiceMode.NAMED if isinstance(choice, NamedToolChoice) else ToolChoiceMode(choice)
        named = choice.function.name if isinstance(choice, NamedToolChoice) else None
        self.family = family_of(template)
        self.parallel = body.parallel_tool_calls
        self._body = body
        tools: list[Tool] = [(t.function.name, t.function.arguments_schema()) for t in body.tools or []]
        callable_tools = [tool for tool in tools if named in (None, tool[0])]
        self._names = frozenset(name for name, _ in callable_tools)
        # GENERIC's answers are JSON whatever the choice (`none`: only `{"response": ...}`, read back as content)
        reads_calls = bool(tools) and (self.mode is not ToolChoiceMode.NONE or self.family is ToolFamily.GENERIC)
        self._format = FORMATS[self.family if reads_calls else None]
        self.grammar = tool_grammar(self.family, callable_tools, self.mode, self.parallel, literal)
        refusal = LLMatcher.validate_grammar(self.grammar) if self.grammar else ""
        if refusal:
            raise UserError(f"tools: the grammar for these tools is refused: {refusal}")
        self._system = instructions(tools, {t.function.name: t.function.description or "" for t in body.tools or []},
                                    self.parallel) if tools else ""
        self._streams: dict[int, _Stream] = {}

    @property
    def constraint(self) -> Constraint | None:
        """What the answers are held to (None: nothing, e.g. `tool_choice: none`)."""
        return Constraint(self.grammar, f"tools:{self.mode.value}") if self.grammar else None

    @classmethod
    def of(cls, body: ChatRequest, fleet: FleetFacade) -> "ToolCalling":
        return cls(body, fleet.chat_template, token_literal(fleet))

    def template_input(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """The messages and the tools (None: none) as the chat template takes them."""
        if not self._body.tools:
            return template_messages(self._body.messages), None
        if self.family is ToolFamily.GENERIC:
            return generic_messages(self._body.messages, self._system), None
        return template_messages(self._body.messages), [t.model_dump(exclude_none=True) for t in self._body.tools]

    def prompt(self, fleet: FleetFacade) -> str:
        return fleet.chat_prompt(*self.template_input())

    def read(self, text: str) -> Answer:
        answer = self._format.parse(text, self._names)
        return answer if self.parallel else Answer(answer.content, answer.calls[:1])

    def message(self, text: str, reason: str) -> tuple[dict[str, Any], str]:
        """A finished answer as OpenAI's message (`content`, and `tool_calls` if it called any) and its
        finish_reason."""
        answer = self.read(text)
        message: dict[str, Any] = {"content": answer.content}
        if answer.calls:
            message["tool_calls"] = [_call_json(call) for call in answer.calls]
        return message, _finish(answer, reason)

    def delta(self, index: int, text: str, reason: str | None) -> tuple[dict[str, Any], str | None]:
        """The stream delta of choice `index` for one more piece of its answer (`reason`: set on the last piece,
        where the calls come), and its finish_reason (None until the last)."""
        stream = self._streams.setdefault(index, _Stream())
        stream.text += text
        calls: tuple[FunctionCall, ...] = ()
        if reason is None:
            content = self._format.visible(stream.text)
        else:
            answer = self.read(stream.text)
            content, calls, reason = answer.content or "", answer.calls, _finish(answer, reason)
        delta: dict[str, Any] = {}
        if len(content) > len(stream.shown):
            delta["content"] = content[len(stream.shown):]
            stream.shown = content
        if calls:
            delta["tool_calls"] = [{"index": i, **_call_json(call)} for i, call in enumerate(calls)]
        return delta, reason
