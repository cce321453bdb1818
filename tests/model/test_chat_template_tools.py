"""Chat templates with tools render as transformers renders them: `tools` handed to the template, assistant
`tool_calls` (arguments as dicts) and `tool` messages in the history, the filters and names templates use
(`tojson` without HTML escaping, `strftime_now`, loop controls). The templates are written here, each in one
family's tool style (Hermes/Qwen `<tool_call>`, Llama 3.x JSON with `<|python_tag|>` and `"parameters"`, Mistral
`[TOOL_CALLS]`), plus one with no tool support (the generic format's case)."""

import json
from pathlib import Path

import pytest
from support.tiny_model import write_tokenizer
from transformers import PreTrainedTokenizerFast

from fleetctl.engine.model.tokenizer import Tokenizer

HERMES = """{%- if tools %}<|im_start|>system
{{ messages[0].content if messages[0].role == 'system' else 'You are helpful.' }}

Tools, one JSON schema each, in <tools></tools>:
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
Call one as <tool_call>
{"name": <name>, "arguments": <args>}
</tool_call><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' and tools %}{% continue %}{% endif %}
{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant
{%- if message.content %}
{{ message.content }}{% endif %}
{%- for call in message.tool_calls %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

LLAMA3_JSON = """{{- bos_token }}<|start_header_id|>system<|end_header_id|>

Cutting Knowledge Date: December 2023
Today Date: {{ strftime_now("%d %b %Y") }}
{%- if tools is not none %}

Environment: ipython{% endif %}<|eot_id|>
{%- for message in messages %}
{%- if message.role == 'assistant' and message.tool_calls %}<|start_header_id|>assistant<|end_header_id|>

<|python_tag|>
{%- for call in message.tool_calls %}
{"name": "{{ call.function.name }}", "parameters": {{ call.function.arguments | tojson }}}
{%- if not loop.last %}; {% endif %}
{% endfor %}<|eom_id|>
{%- elif message.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>

{{ message.content | tojson }}<|eot_id|>
{%- else %}<|start_header_id|>{{ message.role }}<|end_header_id|>

{% if loop.last and tools is not none and message.role == 'user' %}
Answer with a function call as {"name": function name, "parameters": dictionary of its arguments}.

{% for tool in tools %}{{ tool | tojson(indent=4) }}

{% endfor %}{% endif %}{{ message.content | trim }}<|eot_id|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""

MISTRAL = """{{ bos_token }}
{%- for message in messages %}
{%- if message.role == 'user' %}
{%- if loop.last and tools %}
[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}
[INST]{{ message.content }}[/INST]
{%- elif message.role == 'assistant' and message.tool_calls %}[TOOL_CALLS][
{%- for call in message.tool_calls %}
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }},
{{- ' "id": "' ~ call.id ~ '"}' }}{{ ", " if not loop.last }}{% endfor %}]{{ eos_token }}
{%- elif message.role == 'tool' %}
[TOOL_RESULTS]{"call_id": "{{ message.tool_call_id }}", "content": {{ message.content | tojson }}}[/TOOL_RESULTS]
{%- elif message.role == 'assistant' %}{{ message.content }}{{ eos_token }}
{%- else %}{{ raise_exception('Only user, assistant and tool roles are supported') }}
{%- endif %}
{%- endfor %}"""

NO_TOOLS = """{% for message in messages %}<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city <today> & 'now'",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                                               "required": ["city"]}}},
         {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
             "a": {"type": "number"}, "b": {"type": "number"}}}}}]
CONVERSATION = [
    {"role": "user", "content": "Weather in Zürich, and 2+3?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": {"city": "Zürich", "unit": "c"}}},
        {"id": "call_2", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "12°C <cloudy>"},
    {"role": "tool", "tool_call_id": "call_2", "name": "add", "content": "5"},
    {"role": "user", "content": "Thanks! Anything else?"},
]


def _tokenizers(tmp_path: Path, template: str) -> tuple[Tokenizer, PreTrainedTokenizerFast]:
    write_tokenizer(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text()) | {"chat_template": template}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return Tokenizer(tmp_path), PreTrainedTokenizerFast.from_pretrained(tmp_path)


@pytest.mark.parametrize("template", [HERMES, LLAMA3_JSON, MISTRAL, NO_TOOLS],
                         ids=["hermes", "llama3_json", "mistral", "no_tools"])
@pytest.mark.parametrize("with_tools", [True, False], ids=["tools", "no-tools"])
def test_rendering_equals_transformers(tmp_path: Path, template: str, with_tools: bool) -> None:
    ours, theirs = _tokenizers(tmp_path, template)
    tools = TOOLS if with_tools else None
    for messages in (CONVERSATION[:1], CONVERSATION):
        expected = theirs.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        assert ours.apply_chat_template(messages, tools) == expected


def test_tools_reach_the_template_unescaped(tmp_path: Path) -> None:
    ours, _ = _tokenizers(tmp_path, HERMES)
    text = ours.apply_chat_template(CONVERSATION, TOOLS)
    assert '"description": "Weather in a city <today> & \'now\'"' in text  # no HTML escaping
    assert '"arguments": {"city": "Zürich", "unit": "c"}' in text and "<tool_response>\n5\n" in text
