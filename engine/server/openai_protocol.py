"""OpenAI-compatible request bodies, response/chunk builders and error bodies.

A parameter this server does not implement is refused with a 400 that names it when its value would
change the answer (asking for tools and getting plain text is worse than an error); the same field
at its neutral value (`n: 1`, `presence_penalty: 0`, `logprobs: false`, …) is accepted."""

import time
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from fleetctl.engine.core.sequence import MAX_TEMPERATURE, SamplingParams

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1000
# parameter -> its neutral values (the only ones accepted)
UNSUPPORTED: dict[str, tuple[object, ...]] = {
    "tools": (None, []), "tool_choice": (None, "none"), "functions": (None, []), "function_call": (None, "none"),
    "response_format": (None, {"type": "text"}), "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0), "repetition_penalty": (None, 1, 1.0), "logit_bias": (None, {}),
    "best_of": (None, 1), "logprobs": (None, False), "top_logprobs": (None, 0), "n": (None, 1),
    "echo": (None, False), "suffix": (None, ""), "guided_json": (None,), "guided_regex": (None,),
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

    @model_validator(mode="before")
    @classmethod
    def refuse_unimplemented(cls, raw: Any) -> Any:
        if isinstance(raw, dict):
            for name, neutral in UNSUPPORTED.items():
                if name in raw and raw[name] not in neutral:
                    raise ValueError(f"{name} is not supported by this server")
        return raw

    def sampling(self, max_tokens: int) -> SamplingParams:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingParams(max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p,
                              top_k=self.top_k, seed=self.seed, stop=stop, ignore_eos=self.ignore_eos)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingFields):
    prompt: Text | list[int] | list[Text] | list[list[int]]


class TextPart(BaseModel):
    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Text | list[TextPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


def template_messages(messages: list[ChatMessage]) -> list[dict[str, str]]:
    """Messages as the chat template takes them."""
    return [{"role": m.role, "content": m.text()} for m in messages]


class ChatRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)


def error_body(message: str, kind: str, code: str | None = None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_body(rid: str, model: str, text: str, reason: str, use: dict) -> dict:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}], "usage": use}


def completion_chunk(rid: str, model: str, text: str, reason: str | None) -> dict:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}]}


def chat_body(rid: str, model: str, text: str, reason: str, use: dict) -> dict:
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                         "finish_reason": reason}], "usage": use}


def chat_chunk(rid: str, model: str, delta: dict, reason: str | None) -> dict:
    return {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]}


def usage_chunk(rid: str, model: str, kind: str, use: dict) -> dict:
    return {"id": rid, "object": kind, "created": int(time.time()), "model": model, "choices": [], "usage": use}
