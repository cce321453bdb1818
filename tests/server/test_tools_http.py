"""Bad tool requests are 400s with OpenAI's error body naming the field, over HTTP (FastAPI's TestClient) on a
fleet of fake workers; a good one is admitted with its tools rendered (the fakes' scripted text has no calls, so it
comes back as content, finish_reason `stop`/`length`)."""

import pytest
from fastapi.testclient import TestClient

from fleetctl.engine.server.openai_protocol import MAX_TOOLS_JSON

MODEL = "tiny-llama0"
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def chat(fake_client: TestClient, **fields: object):
    return fake_client.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 4} | fields)


def refused(response, param: str, words: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert param in error["message"] and words in error["message"], error


@pytest.mark.parametrize(("fields", "param", "words"), [
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "`nope`, which is not among the tools (get_weather)"),
    ({"tools": [{"type": "function", "function": {"parameters": {}}}]}, "tools.0.function.name", "Field required"),
    ({"tool_choice": "required"}, "tool_choice", "the request has no tools"),
    ({"tools": [], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "tool_choice",
     "the request has no tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools.0.function.parameters", "a JSON schema of an object"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "city"}}]},
     "tools.0.function.parameters", "valid dictionary"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "frob"}}}}}]}, "tools.0.function.parameters",
     "not a JSON schema this server can enforce: Invalid type: frob"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": "(?=x)"}}}}}]},
     "tools.0.function.parameters", "look-around"),
    ({"tools": [{"type": "function", "function": {"name": "f", "description": "x" * MAX_TOOLS_JSON}}]}, "tools",
     f"this server takes {MAX_TOOLS_JSON:,} at most"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]},
     "messages.1.tool_calls.0.function.arguments", "a JSON object as text"),
])
def test_bad_tool_requests_are_400_naming_the_field(fake_client: TestClient, fields: dict, param: str,
                                                    words: str) -> None:
    refused(chat(fake_client, **fields), param, words)


def test_a_tool_request_is_answered(fake_client: TestClient) -> None:
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "12 C"}]
    for choice in ("auto", "none", "required"):
        done = chat(fake_client, tools=[WEATHER], tool_choice=choice, messages=history)
        assert done.status_code == 200, done.text
        answer = done.json()["choices"][0]
        assert answer["finish_reason"] in ("stop", "length") and isinstance(answer["message"]["content"], str)
        assert "tool_calls" not in answer["message"]
    prompt = fake_client.post("/v1/chat/completions", json={"model": MODEL, "messages": history, "max_tokens": 4})
    assert prompt.status_code == 200  # tool history without tools: the template gets it as it is
