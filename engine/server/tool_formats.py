"""How a model family writes tool calls, told from its chat template's text, and how calls are read back out of
an answer: `parse` a finished answer into content and calls (text that does not parse stays content), and
`visible`, the part of an answer still being written that is content whatever comes next (what a stream may
show). Each family's `visible` is a prefix of the content its `parse` gives, for any continuation.

- HERMES (Hermes, Qwen): optional text, then `<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>` blocks;
- LLAMA3_JSON (Llama 3.x): the answer is `{"name": …, "parameters": {…}}` (calls joined by `;`), after an
  optional `<|python_tag|>`;
- MISTRAL: optional text, `[TOOL_CALLS]`, a JSON array of `{"name", "arguments"}`. The opener is a control token
  the detokenizer drops, so an answer that is such an array reads as calls too;
- GENERIC (a template with no tool support): the whole answer is one JSON object, `{"tool_calls": [{"name",
  "arguments"}, …]}` or `{"response": "…"}` (tool_prompt.py describes it to the model);
- PLAIN: no tools asked for (or `tool_choice: none`): all content."""

import json
import re
from dataclasses import dataclass
from enum import Enum

_DECODER = json.JSONDecoder(strict=False)
_RESPONSE_START = re.compile(r'\s*\{\s*"response"\s*:\s*"')


class ToolFamily(Enum):
    HERMES = "hermes"
    LLAMA3_JSON = "llama3_json"
    MISTRAL = "mistral"
    GENERIC = "generic"


HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
MISTRAL_OPEN = "[TOOL_CALLS]"
ARGUMENTS_KEY = {ToolFamily.HERMES: "arguments", ToolFamily.LLAMA3_JSON: "parameters", ToolFamily.MISTRAL: "arguments",
                 ToolFamily.GENERIC: "arguments"}


def family_of(template: str | None) -> ToolFamily:
    """The family whose tool-call format a chat template speaks; GENERIC when it has none."""
    text = template or ""
    if HERMES_OPEN in text:
        return ToolFamily.HERMES
    if MISTRAL_OPEN in text:
        return ToolFamily.MISTRAL
    if PYTHON_TAG in text or ("<|start_header_id|>" in text and "tools" in text):
        return ToolFamily.LLAMA3_JSON
    return ToolFamily.GENERIC


@dataclass(frozen=True)
class FunctionCall:
    name: str
    arguments: str  # a JSON object, as text


@dataclass(frozen=True)
class Answer:
    content: str | None  # None: the answer is only calls
    calls: tuple[FunctionCall, ...] = ()


def _call(value: object, names: frozenset[str]) -> FunctionCall | None:
    """`{"name", "arguments" | "parameters"}` naming one of the tools, its arguments an object (or one as text)."""
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    arguments = value.get("arguments", value.get("parameters"))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict) or set(value) - {"name", "arguments", "parameters"}:
        return None
    return FunctionCall(value["name"], json.dumps(arguments, ensure_ascii=False))


def _value_then(text: str) -> tuple[object, str] | None:
    """The JSON value at the start of `text` (after whitespace) and what follows it, or None."""
    text = text.lstrip()
    try:
        value, end = _DECODER.raw_decode(text)
    except ValueError:
        return None
    return value, text[end:]


def _calls(values: list[object], names: frozenset[str]) -> tuple[FunctionCall, ...] | None:
    calls = tuple(_call(value, names) for value in values)
    return calls if calls and all(calls) else None  # type: ignore[return-value]


def _held(text: str, opener: str) -> int:
    """How many characters at the end of `text` could begin `opener` (kept back from a stream until known)."""
    return next((k for k in range(min(len(opener) - 1, len(text)), 0, -1) if text.endswith(opener[:k])), 0)


def _before(text: str, opener: str) -> str:
    """The content before `opener` that is sure to stay content; "" while it is only whitespace."""
    at = text.find(opener)
    shown = text[:at] if at >= 0 else text[:len(text) - _held(text, opener)]
    return shown if shown.strip() else ""


def _content(text: str) -> str | None:
    return text if text.strip() else None


class ToolFormat:
    """PLAIN: no calls are read; everything is content."""

    def parse(self, text: str, names: frozenset[str]) -> Answer:
        return Answer(text)

    def visible(self, text: str) -> str:
        return text


class HermesFormat(ToolFormat):
    def parse(self, text: str, names: frozenset[str]) -> Answer:
        start = text.find(HERMES_OPEN)
        if start < 0:
            return Answer(text)
        blocks = text[start:].split(HERMES_OPEN)[1:]
        values = []
        for i, block in enumerate(blocks):
            read = _value_then(block)
            if read is None:
                return Answer(text)
            rest = read[1].strip()
            last_unclosed = i == len(blocks) - 1 and not rest  # the answer ended before the closer
            if rest != HERMES_CLOSE and not last_unclosed:
                return Answer(text)
            values.append(read[0])
        calls = _calls(values, names)
        return Answer(_content(text[:start]), calls) if calls else Answer(text)

    def visible(self, text: str) -> str:
        return _before(text, HERMES_OPEN)


class Llama3JsonFormat(ToolFormat):
    def parse(self, text: str, names: frozenset[str]) -> Answer:
        rest = text.strip().removeprefix(PYTHON_TAG)
        values = []
        while rest.strip():
            read = _value_then(rest)
            if read is None:
                return Answer(text)
            values.append(read[0])
            rest = read[1].lstrip()
            if rest and not rest.startswith(";"):
                return Answer(text)
            rest = rest.removeprefix(";")
        calls = _calls(values, names)
        return Answer(None, calls) if calls else Answer(text)

    def visible(self, text: str) -> str:
        start = text.lstrip()
        if not start or start.startswith("{") or start.startswith(PYTHON_TAG) or PYTHON_TAG.startswith(start):
            return ""
        return text


class MistralFormat(ToolFormat):
    def parse(self, text: str, names: frozenset[str]) -> Answer:
        start = text.find(MISTRAL_OPEN)
        content, body = (text[:start], text[start + len(MISTRAL_OPEN):]) if start >= 0 else ("", text)
        read = _value_then(body)
        if read is None or read[1].strip():
            return Answer(text)
        values = read[0] if isinstance(read[0], list) else [read[0]]
        calls = _calls(values, names)
        return Answer(_content(content), calls) if calls else Answer(text)

    def visible(self, text: str) -> str:
        return "" if text.lstrip().startswith("[") else _before(text, MISTRAL_OPEN)


def _string_prefix(body: str) -> str | None:
    """The decoded start of a JSON string's body (after its opening quote), up to its closing quote or to the
    last whole character written so far; None if it is not a JSON string."""
    i = 0
    while i < len(body) and body[i] != '"':
        step = 1
        if body[i] == "\\":
            step = 6 if body[i + 1:i + 2] == "u" else 2
            if step == 6 and 0xD800 <= int(body[i + 2:i + 6].ljust(4, "0"), 16) < 0xDC00:
                step = 12  # a high surrogate: shown with its low half only
        if i + step > len(body):
            break
        i += step
    try:
        return _DECODER.decode(f'"{body[:i]}"')
    except ValueError:
        return None


class GenericFormat(ToolFormat):
    def parse(self, text: str, names: frozenset[str]) -> Answer:
        try:
            value = json.loads(text)
        except ValueError:  # cut short (max_tokens): the answer written so far, if it was one
            return Answer(self.visible(text) or text)
        if isinstance(value, dict) and set(value) == {"response"} and isinstance(value["response"], str):
            return Answer(value["response"])
        if isinstance(value, dict) and set(value) == {"tool_calls"} and isinstance(value["tool_calls"], list):
            calls = _calls(value["tool_calls"], names)
            if calls:
                return Answer(None, calls)
        return Answer(text)

    def visible(self, text: str) -> str:
        start = _RESPONSE_START.match(text)
        if start is None:
            return ""
        try:
            return _string_prefix(text[start.end():]) or ""
        except ValueError:  # a `\u` escape that is not hex: the whole text is what it answered
            return ""


FORMATS: dict[ToolFamily | None, ToolFormat] = {
    None: ToolFormat(), ToolFamily.HERMES: HermesFormat(), ToolFamily.LLAMA3_JSON: Llama3JsonFormat(),
    ToolFamily.MISTRAL: MistralFormat(), ToolFamily.GENERIC: GenericFormat()}
