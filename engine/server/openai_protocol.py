"""OpenAI-compatible request bodies, response/chunk builders and error bodies.

A parameter this server does not implement is refused with a 400 that names it when its value would
change the answer (asking for `best_of` and getting one sample is worse than an error); the same field
at its neutral value (`presence_penalty: 0`, `best_of: 1`, …) is accepted."""

import json
import time
from typing import Annotated, Any, Literal

from llguidance import LLMatcher
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from fleetctl.engine.core.sequence import (
    MAX_LOGIT_BIAS,
    MAX_LOGPROBS,
    MAX_PENALTY,
    MAX_REPETITION_PENALTY,
    MAX_TEMPERATURE,
    SamplingParams,
)
from fleetctl.engine.server.response_format import Constraint, ResponseFormat

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1000
MAX_N = 16  # samples per prompt
MAX_PROMPTS = 64  # prompts per completions request
MAX_TOOLS_JSON = 64 * 1024  # bytes of a request's `tools` as JSON: the grammar built from them compiles quickly
TOOL_NAME = r"^[A-Za-z0-9_.-]{1,64}$"  # OpenAI's function names
# parameter -> its neutral values (the only ones accepted)
UNSUPPORTED: dict[str, tuple[object, ...]] = {
    "functions": (None, []), "function_call": (None, "none"), "best_of": (None, 1), "suffix": (None, ""),
    "guided_json": (None,), "guided_regex": (None,), "prompt_logprobs": (None, 0),
}


def _encodable(text: str) -> str:
    """Refuse text that cannot be UTF-8 (a lone surrogate from a JSON \\ud800 escape)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (it holds a lone surrogate)") from None
    return text


Text = Annotated[str, AfterValidator(_encodable)]


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    """What completions and chat requests share: the model, sampling, stop and streaming fields."""

    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=MAX_TEMPERATURE)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)  # extension (vLLM-style)
    seed: int | None = Field(default=None, ge=0)
    stop: Annotated[Text, Field(max_length=MAX_STOP_CHARS)] | list[Annotated[Text, Field(
        max_length=MAX_STOP_CHARS)]] | None = Field(default=None, max_length=MAX_STOP_STRINGS)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # extension (benchmarks)
    n: int = Field(default=1, ge=1, le=MAX_N)
    user: str | None = Field(default=None, max_length=256)  # names the agent session a turn belongs to (KV kept)
    presence_penalty: float = Field(default=0.0, ge=-MAX_PENALTY, le=MAX_PENALTY)
    frequency_penalty: float = Field(default=0.0, ge=-MAX_PENALTY, le=MAX_PENALTY)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=MAX_REPETITION_PENALTY)  # extension (vLLM-style)
    # token id (as a string, OpenAI's form) -> added to its logit
    logit_bias: dict[Annotated[str, Field(pattern=r"^\d{1,9}$")], Annotated[float, Field(
        ge=-MAX_LOGIT_BIAS, le=MAX_LOGIT_BIAS)]] | None = Field(default=None, max_length=1024)
    min_tokens: int = Field(default=0, ge=0)  # extension (vLLM-style)
    response_format: ResponseFormat | None = None

    @model_validator(mode="before")
    @classmethod
    def refuse_unimplemented(cls, raw: Any) -> Any:
        if isinstance(raw, dict):
            for name, neutral in UNSUPPORTED.items():
                if name in raw and raw[name] not in neutral:
                    raise ValueError(f"{name} is not supported by this server")
        return raw

    def sampling(self, max_tokens: int, constraint: Constraint | None = None) -> SamplingParams:
        """`constraint`: what the output is held to (constraint()'s, or the tool calls')."""
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        bias = tuple(sorted((int(token), value) for token, value in (self.logit_bias or {}).items()))
        return SamplingParams(max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p,
                              top_k=self.top_k, seed=self.seed, stop=stop, ignore_eos=self.ignore_eos,
                              logprobs=self.logprobs_wanted(), presence_penalty=self.presence_penalty,
                              frequency_penalty=self.frequency_penalty,
                              repetition_penalty=self.repetition_penalty, logit_bias=bias,
                              min_tokens=self.min_tokens, grammar=constraint.grammar if constraint else None,
                              constraint=constraint.label if constraint else "")

    def constraint(self) -> Constraint | None:
        """What `response_format` holds the output to, or None for free text."""
        return self.response_format.constraint() if self.response_format else None

    def logprobs_wanted(self) -> int | None:
        """How many alternatives per token to report (0: only the sampled token's), or None for no logprobs."""
        return None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


def _false_is_none(value: object) -> object:
    return None if value is False else value  # `logprobs: false`, as some clients send it: none wanted


class CompletionRequest(SamplingFields):
    prompt: Text | list[int] | Annotated[list[Text], Field(min_length=1, max_length=MAX_PROMPTS)] | Annotated[
        list[Annotated[list[int], Field(min_length=1)]], Field(min_length=1, max_length=MAX_PROMPTS)]
    # the sampled token's logprob and this many alternatives per token
    logprobs: Annotated[Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None, BeforeValidator(_false_is_none)] = None
    echo: bool = False

    @model_validator(mode="after")
    def echo_without_logprobs(self) -> "CompletionRequest":
        if self.echo and self.logprobs is not None:
            raise ValueError("echo with logprobs is not supported by this server (the prompt's logprobs are not "
                             "computed); ask for one or the other")
        return self

    def logprobs_wanted(self) -> int | None:
        return self.logprobs

    def prompts(self) -> list[str | list[int]]:
        """The prompts, each a text or token ids."""
        prompt = self.prompt
        if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int):
            return [prompt]  # type: ignore[list-item]
        return list(prompt)  # type: ignore[arg-type]


class TextPart(BaseModel):
    type: Literal["text"]
    text: Text


def _json_object_text(text: str) -> str:
    try:
        value = json.loads(text)
    except ValueError:
        raise ValueError("must be a JSON object as text") from None
    if not isinstance(value, dict):
        raise ValueError("must be a JSON object as text")
    return text


class CalledFunction(BaseModel):
    name: Text
    arguments: Annotated[Text, AfterValidator(_json_object_text)]


class ToolCall(BaseModel):
    """A call an assistant message made (the history of a conversation with tools)."""

    id: Text
    type: Literal["function"] = "function"
    function: CalledFunction

    def template_dict(self) -> dict[str, Any]:
        """As chat templates take it: the arguments as a dict."""
        return {"id": self.id, "type": self.type,
                "function": {"name": self.function.name, "arguments": json.loads(self.function.arguments)}}


def _enforceable_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A function's `parameters`: a JSON schema of an object that the grammar matcher can enforce."""
    if schema.get("type", "object") != "object":
        raise ValueError("must be a JSON schema of an object (`type: object`)")
    refusal = LLMatcher.validate_grammar(LLMatcher.grammar_from_json_schema(schema))
    if refusal:
        raise ValueError(f"is not a JSON schema this server can enforce: {refusal}")
    return schema


class FunctionSpec(BaseModel):
    name: Annotated[str, Field(pattern=TOOL_NAME)]
    description: Text | None = None
    parameters: Annotated[dict[str, Any], AfterValidator(_enforceable_schema)] | None = None
    strict: bool | None = None

    def arguments_schema(self) -> dict[str, Any]:
        return self.parameters if self.parameters is not None else {"type": "object", "properties": {}}


class ChatTool(BaseModel):
    type: Literal["function"]
    function: FunctionSpec


class FunctionName(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: FunctionName


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Text | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = None  # assistant: the calls it made (its content may be null)
    tool_call_id: Text | None = None  # tool: the call it answers
    name: Text | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""

    def template_dict(self) -> dict[str, Any]:
        """As the chat template takes it (transformers' and vLLM's shape)."""
        message: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.tool_calls:
            message["tool_calls"] = [call.template_dict() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            message["name"] = self.name
        return message


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as the chat template takes them."""
    return [m.template_dict() for m in messages]


class ChatRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True

    @property
    def tool_choice_mode(self) -> str | NamedToolChoice:
        """OpenAI's default: `auto` with tools, `none` without."""
        return self.tool_choice or ("auto" if self.tools else "none")

    @field_validator("tools")
    @classmethod
    def tools_within_bound(cls, tools: list[ChatTool] | None) -> list[ChatTool] | None:
        size = len(json.dumps([tool.model_dump(exclude_none=True) for tool in tools or []]).encode())
        if size > MAX_TOOLS_JSON:
            raise ValueError(f"the tools are {size:,} bytes of JSON; this server takes {MAX_TOOLS_JSON:,} at most")
        return tools

    @field_validator("tool_choice")
    @classmethod
    def tool_choice_among_tools(cls, choice: object, info: ValidationInfo) -> object:
        if "tools" not in info.data:
            return choice  # the tools failed validation: that is the error to report
        names = [tool.function.name for tool in info.data["tools"] or []]
        if (choice == "required" or isinstance(choice, NamedToolChoice)) and not names:
            raise ValueError("a tool call was asked for, but the request has no tools")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise ValueError(f"names `{choice.function.name}`, which is not among the tools ({', '.join(names)})")
        return choice

    @model_validator(mode="after")
    def top_logprobs_needs_logprobs(self) -> "ChatRequest":
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    def logprobs_wanted(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


def error_body(message: str, kind: str, code: str | None = None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def completion_body(rid: str, model: str, choices: list[dict], use: dict) -> dict:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model, "choices": choices,
            "usage": use}


def completion_choice(index: int, text: str, reason: str | None, logprobs: dict | None = None) -> dict:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}


def completion_chunk(rid: str, model: str, choice: dict) -> dict:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model, "choices": [choice]}


def chat_body(rid: str, model: str, choices: list[dict], use: dict) -> dict:
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model, "choices": choices,
            "usage": use}


def chat_choice(index: int, message: dict, reason: str, logprobs: dict | None = None) -> dict:
    """`message`: the answer's `content` (text or None) and, when it called tools, `tool_calls`."""
    return {"index": index, "message": {"role": "assistant", **message}, "logprobs": logprobs,
            "finish_reason": reason}


def chat_chunk(rid: str, model: str, index: int, delta: dict, reason: str | None,
               logprobs: dict | None = None) -> dict:
    return {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}]}


def usage_chunk(rid: str, model: str, kind: str, use: dict) -> dict:
    return {"id": rid, "object": kind, "created": int(time.time()), "model": model, "choices": [], "usage": use}
