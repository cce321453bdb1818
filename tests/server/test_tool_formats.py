"""Tool calls read out of answers, per family: a finished answer as OpenAI's message, and the same answer
streamed, split at every character boundary and a character at a time, giving the same content and calls."""

import json
from pathlib import Path

import pytest

from fleetctl.engine.server.openai_protocol import ChatRequest
from fleetctl.engine.server.tool_calls import ToolCalling
from fleetctl.engine.server.tool_formats import ToolFamily, family_of

TEMPLATES = {ToolFamily.HERMES: "{{ '<tool_call>' }}", ToolFamily.LLAMA3_JSON: "<|python_tag|>{{ x }}",
             ToolFamily.MISTRAL: "[TOOL_CALLS]", ToolFamily.GENERIC: "{{ messages }}"}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
         {"type": "function", "function": {"name": "add"}}]
PARIS = ("get_weather", {"city": "Paris"})
ADD = ("add", {"a": 1, "b": 2})
# family -> [(answer, content, calls)]
CASES = {
    ToolFamily.HERMES: [
        ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
         "Let me check.\n", [PARIS]),
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
         '{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>', None, [PARIS, ADD]),
        ('\n<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}', None, [ADD]),  # unclosed at EOS
        ('<tool_call>\n{"name": "get_weather", "arguments": {"ci', None, []),  # cut: stays content
        ('<tool_call>\n{"name": "weather", "arguments": {}}\n</tool_call>', None, []),  # not a tool
        ("Paris is sunny <3 <tool", None, []),
    ],
    ToolFamily.LLAMA3_JSON: [
        ('{"name": "get_weather", "parameters": {"city": "Paris"}}', None, [PARIS]),
        ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
         '{"name": "add", "parameters": {"a": 1, "b": 2}}', None, [PARIS, ADD]),
        ("It is sunny in <b>Paris</b>.", None, []),
        ('{"not": "a call"}', None, []),
        ('  {"name": "get_weather", "parameters": {"city": "Par', None, []),
    ],
    ToolFamily.MISTRAL: [
        ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]', None, [PARIS]),
        ('[{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "get_weather", "arguments": {"city": "Paris"}}]',
         None, [ADD, PARIS]),  # the opener is a special token: the detokenizer dropped it
        ('Sure. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]', "Sure. ", [PARIS]),
        ("[1] A footnote, [TOOL", None, []),
    ],
    ToolFamily.GENERIC: [
        ('{"response": "It is \\"sunny\\", caf\\u00e9 \\ud83d\\ude00 ok\\n"}', 'It is "sunny", café 😀 ok\n', []),
        ('{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
         '{"name": "add", "arguments": {"a": 1, "b": 2}}]}', None, [PARIS, ADD]),
        ('{"response": "Hello wor', "Hello wor", []),  # cut by max_tokens: the answer so far
        ('{"tool_calls": [{"name"', None, []),
        ('{"tool_calls": [{"name": "nope", "arguments": {}}]}', None, []),
    ],
}


def calling(family: ToolFamily, **fields: object) -> ToolCalling:
    body = ChatRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                       "tools": TOOLS} | fields)
    return ToolCalling(body, TEMPLATES[family], json.dumps)


def read(message: dict) -> tuple[str | None, list[tuple[str, dict]]]:
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls", [])]
    for call in message.get("tool_calls", []):
        assert call["id"].startswith("call_") and call["type"] == "function"
    return message["content"], calls


def streamed(tools: ToolCalling, pieces: list[str]) -> tuple[str, list[tuple[str, dict]], str | None]:
    """The deltas of `pieces` (the last ending the answer) merged as a client does."""
    content, calls, reason = "", [], None
    for i, piece in enumerate(pieces):
        delta, reason = tools.delta(0, piece, "stop" if i == len(pieces) - 1 else None)
        content += delta.get("content", "")
        calls += [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in delta.get("tool_calls", [])]
        assert all(c["index"] == n for n, c in enumerate(delta.get("tool_calls", [])))
    return content, calls, reason


@pytest.mark.parametrize(("family", "case"), [(f, c) for f, cases in CASES.items() for c in cases])
def test_answers_read_whole_and_streamed_at_every_split(family: ToolFamily, case: tuple) -> None:
    text, content, calls = case
    expected_content = content if calls or content is not None else text
    message, reason = calling(family).message(text, "stop")
    assert read(message) == (expected_content, calls)
    assert reason == ("tool_calls" if calls else "stop")
    splits = [[text[:i], text[i:]] for i in range(len(text) + 1)] + [list(text) or [""]]
    for pieces in splits:
        assert streamed(calling(family), pieces) == (expected_content or "", calls, reason), pieces


def test_a_stream_shows_content_while_it_is_written() -> None:
    generic = calling(ToolFamily.GENERIC)
    assert generic.delta(0, '{"response": "It is su', None) == ({"content": "It is su"}, None)
    assert generic.delta(0, 'nny\\u00', None) == ({"content": "nny"}, None)  # an escape shown once whole
    hermes = calling(ToolFamily.HERMES)
    assert hermes.delta(0, "Let me look. <tool_", None) == ({"content": "Let me look. "}, None)
    assert hermes.delta(0, "call>\n{", None) == ({}, None)


def test_cut_calls_finish_by_length_and_parallel_false_keeps_one() -> None:
    text = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "add", "arguments": {}}]}'
    assert calling(ToolFamily.GENERIC).message(text[:30], "length") == ({"content": text[:30]}, "length")
    message, reason = calling(ToolFamily.GENERIC, parallel_tool_calls=False).message(text, "stop")
    assert read(message) == (None, [PARIS]) and reason == "tool_calls"


def test_tool_choice_none_reads_no_calls() -> None:
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    tools = calling(ToolFamily.HERMES, tool_choice="none")
    assert tools.grammar is None and tools.message(text, "stop") == ({"content": text}, "stop")
    assert streamed(tools, [text[:5], text[5:]]) == (text, [], "stop")


def test_family_from_the_template(smollm2_dir: Path) -> None:
    for family, template in TEMPLATES.items():
        assert family_of(template) is family
    assert family_of(None) is ToolFamily.GENERIC
    assert family_of(json.loads((smollm2_dir / "tokenizer_config.json").read_text())["chat_template"]) is (
        ToolFamily.GENERIC)
