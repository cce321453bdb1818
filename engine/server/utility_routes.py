"""The small routes a vLLM user reaches for: /version, and /tokenize and /detokenize with the fleet's
own tokenizer and chat template (to count tokens before sending, or read token ids back)."""

import asyncio
from importlib.metadata import version

from fastapi import APIRouter
from pydantic import BaseModel, Field

from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.model.tokenizer import TokenizerError
from fleetctl.engine.server.errors import APIError
from fleetctl.engine.server.openai_protocol import ChatMessage, Text, template_messages


class TokenizeBody(BaseModel):
    model: str | None = None
    prompt: Text | None = None
    messages: list[ChatMessage] | None = None  # rendered with the chat template first


class DetokenizeBody(BaseModel):
    model: str | None = None
    tokens: list[int] = Field(max_length=1_000_000)


def utility_router(fleet: Fleet) -> APIRouter:
    router = APIRouter()

    @router.get("/version")
    async def server_version() -> dict:
        return {"version": version("fleetctl"), "model": fleet.model_name}

    @router.post("/tokenize")
    async def tokenize(body: TokenizeBody) -> dict:
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "give exactly one of prompt or messages", "invalid_request_error")
        text = body.prompt
        if body.messages is not None:
            try:
                text = fleet.tokenizer.apply_chat_template(template_messages(body.messages))
            except TokenizerError as exc:
                raise APIError(400, str(exc), "invalid_request_error") from None
        tokens = await asyncio.to_thread(fleet.tokenizer.encode, text)
        return {"tokens": tokens, "count": len(tokens), "max_model_len": fleet.max_model_len}

    @router.post("/detokenize")
    async def detokenize(body: DetokenizeBody) -> dict:
        vocab = fleet.model_config.vocab_size
        if any(not 0 <= t < vocab for t in body.tokens):
            raise APIError(400, f"token ids must be in [0, {vocab})", "invalid_request_error")
        return {"prompt": fleet.tokenizer.decode(body.tokens)}

    return router
