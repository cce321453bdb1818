"""OpenAI's Responses API, the subset agent SDKs send: input items (messages, function calls and their outputs),
function tools, `text.format`, `previous_response_id`; and the response object it answers with. A request is
served as the chat request it amounts to (`as_chat`), so tools, formats and sampling behave as on chat."""

import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from fleetctl.engine.core.sequence import MAX_TEMPERATURE
from fleetctl.engine.server.openai_protocol import (
    CalledFunction,
    ChatMessage,
    ChatRequest,
    FunctionSpec,
    Text,
    ToolCall,
)
from fleetctl.engine.server.response_format import JsonSchemaFormat, ResponseFormat


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["input_text", "output_text", "text"]
    text: Text


def _text(content: Text | list[ContentPart]) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


class MessageItem(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Text | list[ContentPart]


class FunctionCallItem(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call"]
    call_id: Text
    name: Text
    arguments: Text


class FunctionCallOutputItem(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call_output"]
    call_id: Text
    output: Text | list[ContentPart]


def _typed(item: Any) -> Any:
    """An easy input message (`{"role", "content"}`) has no `type`: it is a message."""
    return {"type": "message", **item} if isinstance(item, dict) and "type" not in item else item


InputItem = Annotated[MessageItem | FunctionCallItem | FunctionCallOutputItem, Field(discriminator="type"),
                      BeforeValidator(_typed)]


class FunctionTool(FunctionSpec):
    type: Literal["function"]


class NamedFunction(BaseModel):
    type: Literal["function"]
    name: str


class TextFormat(BaseModel):
    """`text.format`: the Responses API's response_format, its json_schema fields inline."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")] = "response"
    json_schema: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None

    def response_format(self) -> ResponseFormat:
        schema = JsonSchemaFormat(name=self.name, schema=self.json_schema, strict=self.strict)
        return ResponseFormat(type=self.type, json_schema=schema if self.type == "json_schema" else None)


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")

    format: TextFormat | None = None


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    input: Text | list[InputItem]
    instructions: Text | None = None  # a system message for this turn only (not carried to the next)
    previous_response_id: Annotated[str, Field(max_length=128)] | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=MAX_TEMPERATURE)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stream: bool = False
    store: bool = True  # false: not kept for a later previous_response_id
    user: str | None = Field(default=None, max_length=256)
    metadata: dict[str, str] | None = None

    @model_validator(mode="after")
    def tools_valid_as_on_chat(self) -> "ResponsesRequest":
        """The tool and format rules of chat (a named tool among the tools, a schema it can enforce, …)."""
        try:
            self.as_chat([])
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise ValueError(f"{where}: {first['msg']}") from None
        return self

    def items(self) -> list[InputItem]:
        return [MessageItem(role="user", content=self.input)] if isinstance(self.input, str) else list(self.input)

    def as_chat(self, history: list[ChatMessage]) -> ChatRequest:
        """The chat request this amounts to, after the conversation so far (`history`)."""
        instructions = [ChatMessage(role="system", content=self.instructions)] if self.instructions else []
        messages = instructions + history + chat_messages(self.items())
        fields: dict[str, Any] = {
            "model": self.model, "messages": [m.model_dump(exclude_none=True) for m in messages],
            "parallel_tool_calls": self.parallel_tool_calls, "temperature": self.temperature, "top_p": self.top_p,
            "max_tokens": self.max_output_tokens, "user": self.user}
        if self.tools:
            fields["tools"] = [{"type": "function", "function": tool.model_dump(exclude={"type"}, exclude_none=True)}
                               for tool in self.tools]
        if isinstance(self.tool_choice, NamedFunction):
            fields["tool_choice"] = {"type": "function", "function": {"name": self.tool_choice.name}}
        elif self.tool_choice is not None:
            fields["tool_choice"] = self.tool_choice
        if self.text and self.text.format:
            fields["response_format"] = self.text.format.response_format().model_dump(by_alias=True,
                                                                                       exclude_none=True)
        return ChatRequest.model_validate(fields)


def chat_messages(items: list[InputItem]) -> list[ChatMessage]:
    """Input items as chat messages: consecutive function calls are one assistant message's tool_calls, each
    output a tool message; a developer message is a system one."""
    messages: list[ChatMessage] = []
    for item in items:
        if isinstance(item, MessageItem):
            role = "system" if item.role == "developer" else item.role
            messages.append(ChatMessage(role=role, content=_text(item.content)))
        elif isinstance(item, FunctionCallItem):
            call = ToolCall(id=item.call_id, function=CalledFunction(name=item.name, arguments=item.arguments))
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant" and last.tool_calls:
                last.tool_calls.append(call)
            else:
                messages.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))
        else:
            messages.append(ChatMessage(role="tool", tool_call_id=item.call_id, content=_text(item.output)))
    return messages


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def output_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat answer (`content`, `tool_calls`) as the response's output items."""
    items: list[dict[str, Any]] = []
    if message.get("content"):
        items.append(message_item(new_id("msg"), message["content"]))
    for call in message.get("tool_calls") or []:
        items.append({"type": "function_call", "id": new_id("fc"), "call_id": call["id"], "status": "completed",
                      "name": call["function"]["name"], "arguments": call["function"]["arguments"]})
    return items


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []}


def response_body(response_id: str, body: ResponsesRequest, model: str, output: list[dict[str, Any]],
                  finish_reason: str | None, usage: dict[str, int] | None, created: float) -> dict[str, Any]:
    """The response object; `finish_reason` None: still in progress; "length": incomplete."""
    status = "in_progress" if finish_reason is None else "incomplete" if finish_reason == "length" else "completed"
    return {
        "id": response_id, "object": "response", "created_at": int(created), "status": status, "model": model,
        "output": output, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.instructions, "previous_response_id": body.previous_response_id,
        "tools": [tool.model_dump(exclude_none=True) for tool in body.tools or []],
        "tool_choice": body.tool_choice.model_dump() if isinstance(body.tool_choice, NamedFunction) else (
            body.tool_choice or "auto"),
        "parallel_tool_calls": body.parallel_tool_calls, "temperature": body.temperature, "top_p": body.top_p,
        "max_output_tokens": body.max_output_tokens, "store": body.store, "metadata": body.metadata or {},
        "text": {"format": body.text.format.model_dump(by_alias=True) if body.text and body.text.format else {
            "type": "text"}},
        "usage": None if usage is None else {
            "input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
            "total_tokens": usage["total_tokens"], "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0}},
    }
