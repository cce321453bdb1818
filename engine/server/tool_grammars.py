"""The llguidance grammar that constrains an answer to tool calls, per family (tool_formats.py says the formats):
each call is JSON of `{"name": <a tool's name>, <the family's arguments key>: <that tool's parameters>}`, laid
out as json.dumps writes it (no free whitespace a sampled answer could drift into), between the family's opener
and closer. GENERIC's whole answer is one JSON object (`auto` allowing `{"response": "…"}` beside the calls); a
native family's `required` and named answers are calls from the first token, and its `auto` answers may be plain
text, but once the opener is written (llama.cpp's lazy grammar: a lazy lexeme ends at its trigger) what follows
must be valid calls."""

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
    """GENERIC's whole answer: `{"tool_calls": [...]}`, or with `auto` also `{"response": "..."}`, or with `none`
    only that (the prompt is the same for every tool choice, so a conversation's turns share their prefix)."""
    response = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"],
                "additionalProperties": False}
    if mode is ToolChoiceMode.NONE:
        return response
    calls: dict[str, Any] = {"type": "array", "items": call_schema(tools, "arguments"), "minItems": 1}
    if not parallel:
        calls["maxItems"] = 1
    with_calls = {"type": "object", "properties": {"tool_calls": calls}, "required": ["tool_calls"],
                  "additionalProperties": False}
    if mode is not ToolChoiceMode.AUTO:
        return with_calls
    return {"anyOf": [with_calls, response]}


def _json(schema: dict[str, Any]) -> str:
    return "%json " + json.dumps({**schema, "x-guidance": JSON_LAYOUT})


def _open_rule(opener: str, free: bool) -> str:
    """The rule `open`: the opener, after free text when the answer may start with text (`auto`). The text is a
    lazy lexeme, so the first opener ends it and what follows must be a call; a special token ends it anyway
    (text cannot hold one)."""
    if not free:
        return f"open: {opener}\n"
    return f"open: TEXT {opener}\n" if opener.startswith("<[") else f"open[lazy]: TEXT {opener}\n"


def _native(family: ToolFamily, tools: list[Tool], parallel: bool, free: bool, literal: TokenLiteral) -> str:
    """A Lark grammar of one call (or, with `parallel`, one or more) in the family's own format; with `free`, plain
    text instead is allowed too (a Llama answer that does not start with `{`, or text before the opener)."""
    call = _json(call_schema(tools, ARGUMENTS_KEY[family]))
    if family is ToolFamily.LLAMA3_JSON:
        calls = 'call ("; " call)*' if parallel else "call"
        return f"start: PLAIN | {calls}\ncall: {call}\nPLAIN: /([^{{](.|\\n)*)?/\n" if free else (
            f"start: {calls}\ncall: {call}\n")
    if family is ToolFamily.MISTRAL:
        array: dict[str, Any] = {"type": "array", "items": call_schema(tools, "arguments"), "minItems": 1}
        if not parallel:
            array["maxItems"] = 1
        opener, body, more = literal(MISTRAL_OPEN), _json(array), ""
    else:
        opener, body = literal(HERMES_OPEN), f'"\\n" {call} "\\n" {literal(HERMES_CLOSE)}'
        more = f' ("\\n" {opener} body)*' if parallel else ""
    text = "TEXT: /(.|\\n)*/\n" if free else ""
    return f"start: {'TEXT | ' if free else ''}open body{more}\nbody: {body}\n{_open_rule(opener, free)}{text}"


def tool_grammar(family: ToolFamily, tools: list[Tool], mode: ToolChoiceMode, parallel: bool,
                 literal: TokenLiteral) -> str | None:
    """The grammar for an answer (None: unconstrained). `tools`: those the answer may call (the named one only,
    for a named tool_choice)."""
    if not tools:
        return None
    if family is ToolFamily.GENERIC:
        return LLMatcher.grammar_from_json_schema(generic_schema(tools, mode, parallel), overrides=JSON_LAYOUT)
    if mode is ToolChoiceMode.NONE:
        return None
    free = mode is ToolChoiceMode.AUTO
    return LLMatcher.grammar_from_lark(_native(family, tools, parallel, free, literal))
