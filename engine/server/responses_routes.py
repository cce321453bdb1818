"""/v1/responses: a turn of a conversation, answered whole or as the Responses API's stream events. It runs as
the chat request it amounts to (the conversation kept under `previous_response_id` before its input), and is
kept in turn unless `store: false`."""

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from fleetctl.engine.server import openai_protocol as oai
from fleetctl.engine.server.choices import Choices
from fleetctl.engine.server.conversations import Conversations
from fleetctl.engine.server.depends import ServedFleet
from fleetctl.engine.server.errors import GenerationFailed
from fleetctl.engine.server.openai_routes import admit, check_model, compiled, request_id_of, session_of, tokenize
from fleetctl.engine.server.responses_protocol import (
    ResponsesRequest,
    chat_messages,
    message_item,
    new_id,
    output_items,
    response_body,
)
from fleetctl.engine.server.tool_calls import ToolCalling

router = APIRouter()


async def conversations_of(request: Request) -> Conversations:
    return request.app.state.conversations


Kept = Annotated[Conversations, Depends(conversations_of)]


@dataclass
class Turn:
    """One response being answered: what it is, and what to keep of it once it ends."""

    response_id: str
    body: ResponsesRequest
    model: str
    before: list[oai.ChatMessage]  # the conversation up to and including this turn's input
    session: str
    created: float = field(default_factory=time.time)

    def body_of(self, output: list[dict[str, Any]], reason: str | None, usage: dict | None) -> dict[str, Any]:
        return response_body(self.response_id, self.body, self.model, output, reason, usage, self.created)

    def keep(self, kept: Conversations, message: dict[str, Any]) -> None:
        if self.body.store:
            calls = [oai.ToolCall.model_validate(call) for call in message.get("tool_calls") or []]
            answer = oai.ChatMessage(role="assistant", content=message.get("content"), tool_calls=calls or None)
            kept.keep(self.response_id, [*self.before, answer], self.session)


@router.post("/v1/responses")
async def responses(body: ResponsesRequest, request: Request, fleet: ServedFleet, kept: Kept) -> object:
    check_model(fleet, body.model)
    previous = kept.get(body.previous_response_id) if body.previous_response_id else None
    history = previous.messages if previous else []
    chat = body.as_chat(history)
    response_id = request_id_of(request) or new_id("resp")
    # a conversation's turns are one session (its KV kept for --session-ttl); one never to be continued is none
    session = previous.session if previous else session_of(request, chat) or (response_id if body.store else "")
    turn = Turn(response_id, body, fleet.model_name, history + chat_messages(body.items()), session)
    tools = ToolCalling.of(chat, fleet)
    ids = await tokenize(fleet, tools.prompt(fleet))
    constraint = await compiled(fleet, tools.constraint or chat.constraint())
    choices = admit(fleet, [ids], chat, chat.max_tokens, fleet.max_model_len, response_id, session,
                    constraint=constraint)
    if body.stream:
        return StreamingResponse(events(turn, choices, tools, kept), media_type="text/event-stream")
    await choices.collect(request)
    choice = choices.choices[0]
    message, reason = tools.message(choice.text, choice.finish_reason)
    turn.keep(kept, message)
    return turn.body_of(output_items(message), reason, choices.usage())


async def events(turn: Turn, choices: Choices, tools: ToolCalling, kept: Conversations) -> AsyncIterator[str]:
    """The Responses API's stream: created, in progress, the message's text deltas as they come, each function
    call whole once the answer ended, then completed (or incomplete) with the whole response."""
    stream = _EventStream()
    text_id = new_id("msg")
    text = ""
    output: list[dict[str, Any]] = []
    try:
        yield stream.event("response.created", response=turn.body_of([], None, None))
        yield stream.event("response.in_progress", response=turn.body_of([], None, None))
        async for choice, event in choices.events():
            if event.error:
                yield stream.event("error", code=GenerationFailed.error_type, message=event.error, param=None)
                return
            delta, reason = tools.delta(choice.index, event.text, event.finish_reason)
            if delta.get("content"):
                if not text:
                    yield stream.event("response.output_item.added", output_index=0,
                                       item=message_item(text_id, "", "in_progress"))
                    yield stream.event("response.content_part.added", item_id=text_id, output_index=0,
                                       content_index=0, part=_part(""))
                text += delta["content"]
                yield stream.event("response.output_text.delta", item_id=text_id, output_index=0, content_index=0,
                                   delta=delta["content"])
            if reason is None:
                continue
            if text:
                output.append(message_item(text_id, text))
                yield stream.event("response.output_text.done", item_id=text_id, output_index=0, content_index=0,
                                   text=text)
                yield stream.event("response.content_part.done", item_id=text_id, output_index=0, content_index=0,
                                   part=_part(text))
                yield stream.event("response.output_item.done", output_index=0, item=output[0])
            for call in output_items({"tool_calls": delta.get("tool_calls")}):
                index = len(output)
                output.append(call)
                yield stream.event("response.output_item.added", output_index=index,
                                   item={**call, "status": "in_progress", "arguments": ""})
                yield stream.event("response.function_call_arguments.delta", item_id=call["id"],
                                   output_index=index, delta=call["arguments"])
                yield stream.event("response.function_call_arguments.done", item_id=call["id"],
                                   output_index=index, arguments=call["arguments"])
                yield stream.event("response.output_item.done", output_index=index, item=call)
            turn.keep(kept, {"content": text or None, "tool_calls": delta.get("tool_calls")})
            done = "response.incomplete" if reason == "length" else "response.completed"
            yield stream.event(done, response=turn.body_of(output, reason, choices.usage()))
    finally:
        choices.cancel()  # no-op when finished; stops the work when the client went away


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


class _EventStream:
    """Server-sent events numbered in order, as the Responses API sends them."""

    def __init__(self) -> None:
        self.sequence = 0

    def event(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload)}\n\n"
