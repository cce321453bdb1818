"""The llguidance grammar that constrains an answer to tool calls, per family (tool_formats.py says the formats):
each call is JSON of `{"name": <a tool's name>, <the family's arguments key>: <that tool's parameters>}`, laid
out as json.dumps writes it (no free whitespace a sampled answer could drift into), between the family's opener
and closer. GENERIC is always constrained when it may call (its whole answer is one JSON object, `auto`
allowing `{"response": "…"}` beside the calls); the native families are constrained for `required` and named
calls, and left free for `auto` (their answer may be plain text)."""

import json
from collections.abc import Callable
from enum import Enum
from typing import Any

from llguidance import LLMatcher

from fleetctl.engine.server.response_format import JSON_LAYOUT
from fleetctl.engine.server.tool_formats import ARGUMENTS_KEY, HERMES_CLOSE, HERMES_OPEN, MISTRAL_OPEN, ToolFamily

Tool = tuple[str, dict[str, Any]]  # (name, JSON schema of its arguments)
TokenLiteral = Callable[[str], str]  # an opener's text -> how a Lark grammar names it (a special token by id)


class ToolChoiceMode(Enum):
    NONE = "none"
    AUTO = "auto"
    REQUIRED = "required"
    NAMED = "named"


def call_schema(tools: list[Tool], arguments_key: str) -> dict[str, Any]:
    """One call of any of `tools`, as JSON schema."""
    variants = [{"type": "object", "properties": {"name": {"const": name}, arguments_key: schema},
                 "required": ["name", arguments_key], "additionalProperties": False} for name, schema in tools]
    return variants[0] if len(variants) == 1 else {"anyOf": variants}


def generic_schema(tools: list[Tool], mode: ToolChoiceMode, parallel: bool) -> dict[str, Any]:
    """GENERIC's whole answer: `{"tool_calls": [...]}`, or with `auto` also `{"response": "..."}`."""
    calls: dict[str, Any] = {"type": "array", "items": call_schema(tools, "arguments"), "minItems": 1}
    if not parallel:
        calls["maxItems"] = 1
    with_calls = {"type": "object", "properties": {"tool_calls": calls}, "required": ["tool_calls"],
                  "additionalProperties": False}
    if mode is not ToolChoiceMode.AUTO:
        return with_calls
    response = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"],
                "additionalProperties": False}
    return {"anyOf": [with_calls, response]}


def _json(schema: dict[str, Any]) -> str:
    return "%json " + json.dumps({**schema, "x-guidance": JSON_LAYOUT})


def _native(family: ToolFamily, tools: list[Tool], parallel: bool, literal: TokenLiteral) -> str:
    """A Lark grammar of one call (or, with `parallel`, one or more) in the family's own format."""
    call = _json(call_schema(tools, ARGUMENTS_KEY[family]))
    if family is ToolFamily.MISTRAL:
        array: dict[str, Any] = {"type": "array", "items": call_schema(tools, "arguments"), "minItems": 1}
        if not parallel:
            array["maxItems"] = 1
        return f"start: {literal(MISTRAL_OPEN)} {_json(array)}\n"
    if family is ToolFamily.HERMES:
        call = f'{literal(HERMES_OPEN)} "\\n" {call} "\\n" {literal(HERMES_CLOSE)}'
        separator = '"\\n"'
    else:
        separator = '"; "'
    more = f" ({separator} call)*" if parallel else ""
    return f"start: call{more}\ncall: {call}\n"


def tool_grammar(family: ToolFamily, tools: list[Tool], mode: ToolChoiceMode, parallel: bool,
                 literal: TokenLiteral) -> str | None:
    """The grammar for an answer (None: unconstrained). `tools`: those the answer may call (the named one only,
    for a named tool_choice)."""
    if mode is ToolChoiceMode.NONE or not tools:
        return None
    if family is ToolFamily.GENERIC:
        return LLMatcher.grammar_from_json_schema(generic_schema(tools, mode, parallel), overrides=JSON_LAYOUT)
    if mode is ToolChoiceMode.AUTO:
        return None
    return LLMatcher.grammar_from_lark(_native(family, tools, parallel, literal))
