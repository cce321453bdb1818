"""/v1/responses over HTTP on fake workers: a turn answered whole or streamed as the API's events, a later turn
continued from `previous_response_id` (the kept conversation before its input), the 404 for one not kept, the
400s naming the field; and the input items as the chat messages they amount to."""

import json
import time

import pytest
from fastapi.testclient import TestClient

from fleetctl.engine.server.conversations import Conversations, ResponseNotFound
from fleetctl.engine.server.openai_protocol import ChatMessage
from fleetctl.engine.server.responses_protocol import ResponsesRequest, chat_messages

MODEL = "tiny-llama0"
WEATHER = {"type": "function", "name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def respond(client: TestClient, **fields: object):
    return client.post("/v1/responses", json={"model": MODEL, "max_output_tokens": 4} | fields)


def prompt_tokens(client: TestClient, response_id: str) -> int:
    rows = client.get("/fleet/requests", params={"limit": 100}).json()["requests"]
    return next(r["prompt_tokens"] for r in rows if r["request_id"] == response_id)


def test_a_turn_is_answered_and_the_next_continues_its_conversation(fake_client: TestClient) -> None:
    first = respond(fake_client, input="Weather in Paris?", instructions="Be brief.")
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["object"] == "response" and body["id"].startswith("resp_") and body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    [item] = body["output"]
    assert item["type"] == "message" and item["role"] == "assistant" and item["content"][0]["type"] == "output_text"
    assert body["usage"]["output_tokens"] == 4 and body["usage"]["input_tokens"] > 0

    second = respond(fake_client, input="And in Rome?", previous_response_id=body["id"])
    assert second.status_code == 200, second.text
    alone = respond(fake_client, input="And in Rome?")
    # the second turn's prompt holds the first turn (question and answer) before its own input
    assert prompt_tokens(fake_client, second.json()["id"]) > prompt_tokens(fake_client, alone.json()["id"]) + 4


def test_a_response_not_kept_is_a_404_naming_the_id(fake_client: TestClient) -> None:
    unknown = respond(fake_client, input="hi", previous_response_id="resp_nope")
    assert unknown.status_code == 404
    error = unknown.json()["error"]
    assert error["code"] == "previous_response_not_found" and "resp_nope" in error["message"]
    unstored = respond(fake_client, input="hi", store=False).json()["id"]
    assert respond(fake_client, input="hi", previous_response_id=unstored).status_code == 404


def test_a_streamed_turn_sends_the_api_events_in_order(fake_client: TestClient) -> None:
    with fake_client.stream("POST", "/v1/responses", json={"model": MODEL, "input": "hi", "stream": True,
                                                           "max_output_tokens": 4}) as streamed:
        events = [json.loads(line[6:]) for line in streamed.iter_lines() if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == text


@pytest.mark.parametrize(("fields", "param"), [
    ({"input": []}, "messages"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input.0"),
    ({"tools": [{"type": "function", "parameters": {}}]}, "tools.0.name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object", "x": "y" * 70_000}}}},
     "65,536"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{oops"}]}, "arguments"),
])
def test_bad_bodies_are_400_naming_the_field(fake_client: TestClient, fields: dict, param: str) -> None:
    response = respond(fake_client, **({"input": "hi"} | fields))
    assert response.status_code == 400 and param in response.json()["error"]["message"], response.text


def test_input_items_are_the_chat_messages_they_amount_to() -> None:
    body = ResponsesRequest.model_validate({"model": MODEL, "input": [
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": [{"type": "input_text", "text": "Weather and time "}, {"type": "input_text",
                                                                                     "text": "in Paris?"}]},
        {"type": "function_call", "call_id": "a", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "b", "name": "get_time", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "a", "output": "sunny"},
        {"type": "function_call_output", "call_id": "b", "output": [{"type": "input_text", "text": "14:05"}]},
    ]})
    messages = chat_messages(body.items())
    assert [(m.role, m.text()) for m in messages] == [
        ("system", "Use tools."), ("user", "Weather and time in Paris?"), ("assistant", ""), ("tool", "sunny"),
        ("tool", "14:05")]
    assert [c.id for c in messages[2].tool_calls or []] == ["a", "b"]
    assert [m.tool_call_id for m in messages[3:]] == ["a", "b"]


def test_kept_conversations_expire_oldest_first() -> None:
    kept = Conversations(ttl_s=0.2)
    kept.keep("resp_a", [ChatMessage(role="user", content="a")], "resp_a")
    time.sleep(0.25)
    kept.keep("resp_b", [ChatMessage(role="user", content="b")], "resp_a")
    assert kept.get("resp_b").session == "resp_a"
    with pytest.raises(ResponseNotFound, match="resp_a"):
        kept.get("resp_a")
