"""The grammars tool calls are sampled under, compiled for smollm2's tokenizer as the fleet compiles them: each
accepts its family's calls of the tools' schemas, laid out as json.dumps writes them, and nothing else; and the
generic format's prompt, which every template renders (one refusing a `tool` role included)."""

import json
from pathlib import Path

import pytest

from fleetctl.engine.core.grammar import Grammars
from fleetctl.engine.model.tokenizer import Tokenizer
from fleetctl.engine.server.openai_protocol import ChatMessage, ChatRequest
from fleetctl.engine.server.tool_calls import ToolCalling, token_literal
from fleetctl.engine.server.tool_formats import ToolFamily
from fleetctl.engine.server.tool_prompt import generic_messages, instructions

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
         {"type": "function", "function": {"name": "add", "parameters": {
             "type": "object", "properties": {"a": {"type": "integer"}}}}}]
TEMPLATES = {ToolFamily.HERMES: "<tool_call>", ToolFamily.LLAMA3_JSON: "<|python_tag|>",
             ToolFamily.MISTRAL: "[TOOL_CALLS]", ToolFamily.GENERIC: ""}
PARIS = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
ADD = '{"name": "add", "arguments": {"a": 1}}'
# (family, request fields, answer, accepted)
CASES = [
    (ToolFamily.GENERIC, {}, f'{{"tool_calls": [{PARIS}, {ADD}]}}', True),
    (ToolFamily.GENERIC, {}, '{"response": "It is \\"sunny\\"."}', True),
    (ToolFamily.GENERIC, {}, '{ "response": "spaced"}', False),
    (ToolFamily.GENERIC, {}, '{"tool_calls": [{"name": "get_weather", "arguments": {"city": 3}}]}', False),
    (ToolFamily.GENERIC, {}, '{"tool_calls": [{"name": "get_weather", "arguments": {}}]}', False),
    (ToolFamily.GENERIC, {"tool_choice": "required"}, '{"response": "no"}', False),
    (ToolFamily.GENERIC, {"tool_choice": "required"}, f'{{"tool_calls": [{ADD}]}}', True),
    (ToolFamily.GENERIC, {"tool_choice": {"type": "function", "function": {"name": "add"}}},
     f'{{"tool_calls": [{PARIS}]}}', False),
    (ToolFamily.GENERIC, {"parallel_tool_calls": False}, f'{{"tool_calls": [{PARIS}, {ADD}]}}', False),
    (ToolFamily.GENERIC, {"parallel_tool_calls": False}, f'{{"tool_calls": [{PARIS}]}}', True),
    (ToolFamily.HERMES, {"tool_choice": "required"}, f"<tool_call>\n{PARIS}\n</tool_call>\n<tool_call>\n{ADD}\n"
                                                     f"</tool_call>", True),
    (ToolFamily.HERMES, {"tool_choice": "required"}, f"Sure.<tool_call>\n{PARIS}\n</tool_call>", False),
    (ToolFamily.HERMES, {"tool_choice": "required"}, '<tool_call>\n{"name": "add",  "arguments": {}}\n</tool_call>',
     False),
    (ToolFamily.LLAMA3_JSON, {"tool_choice": "required"},
     '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "add", "parameters": {"a": 1}}', True),
    (ToolFamily.LLAMA3_JSON, {"tool_choice": "required"}, PARIS, False),  # Llama's key is "parameters"
    (ToolFamily.MISTRAL, {"tool_choice": "required"}, f"[TOOL_CALLS][{PARIS}, {ADD}]", True),
    (ToolFamily.MISTRAL, {"tool_choice": "required", "parallel_tool_calls": False},
     f"[TOOL_CALLS][{PARIS}, {ADD}]", False),
    # auto: free text, but once the opener is written, valid calls
    (ToolFamily.HERMES, {}, "It is <b>sunny</b>, no tool needed.", True),
    (ToolFamily.HERMES, {}, f"Let me look.\n<tool_call>\n{PARIS}\n</tool_call>\n<tool_call>\n{ADD}\n</tool_call>",
     True),
    (ToolFamily.HERMES, {}, '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>', False),
    (ToolFamily.HERMES, {}, "Checking <tool_call> the weather", False),
    (ToolFamily.HERMES, {"parallel_tool_calls": False},
     f"<tool_call>\n{PARIS}\n</tool_call>\n<tool_call>\n{ADD}\n</tool_call>", False),
    (ToolFamily.LLAMA3_JSON, {}, "Paris is sunny {mostly}.", True),
    (ToolFamily.LLAMA3_JSON, {}, '{"name": "add", "parameters": {"a": 1}}', True),
    (ToolFamily.LLAMA3_JSON, {}, '{"answer": "sunny"}', False),
    (ToolFamily.MISTRAL, {}, "Sunny.", True),
    (ToolFamily.MISTRAL, {}, f"Sure. [TOOL_CALLS][{ADD}]", True),
    (ToolFamily.MISTRAL, {}, "Sure. [TOOL_CALLS] no", False),
]


@pytest.fixture(scope="module")
def smollm2(smollm2_dir: Path) -> tuple[Tokenizer, Grammars]:
    tokenizer = Tokenizer(smollm2_dir)
    return tokenizer, Grammars(tokenizer, tokenizer.vocab_size)


def calling(family: ToolFamily, tokenizer: Tokenizer, **fields: object) -> ToolCalling:
    body = ChatRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                       "tools": TOOLS} | fields)
    return ToolCalling(body, TEMPLATES[family], token_literal(tokenizer))  # type: ignore[arg-type]


def accepts(grammars: Grammars, grammar: str, token_ids: list[int]) -> bool:
    matcher = grammars.compile(grammar).matcher.deep_copy()
    return matcher.validate_tokens(token_ids) == len(token_ids) and matcher.consume_tokens(token_ids) and (
        matcher.is_accepting())


@pytest.mark.parametrize(("family", "fields", "answer", "accepted"), CASES)
def test_grammar_accepts_exactly_its_familys_calls(smollm2: tuple, family: ToolFamily, fields: dict, answer: str,
                                                   accepted: bool) -> None:
    tokenizer, grammars = smollm2
    grammar = calling(family, tokenizer, **fields).grammar
    assert grammar is not None
    assert accepts(grammars, grammar, tokenizer.encode(answer)) is accepted


def test_none_is_free_in_a_native_format_and_a_plain_answer_in_the_generic_one(smollm2: tuple) -> None:
    tokenizer, grammars = smollm2
    for family in ToolFamily:
        none = calling(family, tokenizer, tool_choice="none")
        if family is not ToolFamily.GENERIC:
            assert none.grammar is None
            continue
        assert none.grammar is not None
        assert accepts(grammars, none.grammar, tokenizer.encode('{"response": "It is sunny."}'))
        assert not accepts(grammars, none.grammar, tokenizer.encode(
            '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'))
        assert none.message('{"response": "It is sunny."}', "stop") == ({"content": "It is sunny."}, "stop")


def test_the_generic_prompt_is_the_same_for_every_tool_choice(smollm2: tuple) -> None:
    """So a conversation's turns share their prefix whatever each turn's tool choice (its KV is reused)."""
    tokenizer, _ = smollm2
    prompts = {choice: calling(ToolFamily.GENERIC, tokenizer, tool_choice=choice).template_input()
               for choice in ("none", "auto", "required")}
    assert prompts["none"] == prompts["auto"] == prompts["required"]


def test_a_special_token_opener_is_named_by_id(smollm2: tuple) -> None:
    """An opener the model has as a special token (here smollm2's `<|im_start|>`) is matched as that token."""
    tokenizer, grammars = smollm2
    special = tokenizer.encode("<|im_start|>")[-1]
    literal = token_literal(tokenizer)  # type: ignore[arg-type]
    assert literal("<|im_start|>") == f"<[{special}]>" and literal("[TOOL_CALLS]") == '"[TOOL_CALLS]"'

    def as_special(text: str) -> str:  # smollm2 standing in for a model with [TOOL_CALLS] as a special token
        return literal("<|im_start|>" if text == "[TOOL_CALLS]" else text)

    body = ChatRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                       "tools": TOOLS})
    for choice, text in (("required", []), ("auto", tokenizer.encode("Sure. "))):
        grammar = ToolCalling(body.model_copy(update={"tool_choice": choice}), "[TOOL_CALLS]", as_special).grammar
        assert grammar is not None and f"<[{special}]>" in grammar
        assert accepts(grammars, grammar, [*text, special, *tokenizer.encode(f"[{ADD}]")])
        assert not accepts(grammars, grammar, [*text, special, *tokenizer.encode("no call")])
        assert accepts(grammars, grammar, tokenizer.encode(f"[TOOL_CALLS][{ADD}]")) is (choice == "auto")  # text


STRICT_ROLES = ("{% for m in messages %}{% if m.role not in ('system', 'user', 'assistant') %}"
                "{{ raise_exception('roles are user and assistant') }}{% endif %}"
                "<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}")


def test_generic_conversation_renders_in_any_template(tmp_path: Path, smollm2_dir: Path) -> None:
    messages = [ChatMessage.model_validate(m) for m in [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and 1+?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12 C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "2"}]]
    system = instructions([("get_weather", {"type": "object"})], {"get_weather": "Weather now"}, True)
    rendered = generic_messages(messages, system)
    assert [m["role"] for m in rendered] == ["system", "user", "assistant", "user"]
    assert rendered[0]["content"].startswith("Be brief.\n\nYou have these tools")
    assert rendered[2]["content"] == f'{{"tool_calls": [{PARIS}, {ADD}]}}'
    assert rendered[3]["content"] == "Result of get_weather (call_1): 12 C\nResult of add (call_2): 2"
    (tmp_path / "tokenizer.json").write_bytes((smollm2_dir / "tokenizer.json").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": STRICT_ROLES}))
    strict = Tokenizer(tmp_path)
    assert "<user>Result of get_weather" in strict.apply_chat_template(rendered)
    with pytest.raises(Exception, match="roles are user and assistant"):
        strict.apply_chat_template([m.template_dict() for m in messages])
