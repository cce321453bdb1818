"""The small routes: /health and /metrics (always open), /version, and — for a vLLM user — /tokenize and
/detokenize with the fleet's own tokenizer and chat template (to count tokens before sending, or read token ids
back)."""

import asyncio
from importlib.metadata import version

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pydantic import BaseModel, Field

from fleetctl.engine.fleet.status_view import Health
from fleetctl.engine.server.depends import ServedFleet
from fleetctl.engine.server.openai_protocol import ChatMessage, Text, template_messages
from fleetctl.errors import UserError

router = APIRouter()


class TokenizeBody(BaseModel):
    model: str | None = None
    prompt: Text | None = None
    messages: list[ChatMessage] | None = None  # rendered with the chat template first


class DetokenizeBody(BaseModel):
    model: str | None = None
    tokens: list[int] = Field(max_length=1_000_000)


@router.get("/health")
async def health(fleet: ServedFleet) -> JSONResponse:
    """200 while running workers take prompts and decode; 503 degraded or shutting down."""
    state = fleet.health()
    return JSONResponse({"status": state.value}, 200 if state is Health.OK else 503)


@router.get("/metrics")
async def metrics(fleet: ServedFleet) -> PlainTextResponse:
    return PlainTextResponse(fleet.metrics(), media_type=CONTENT_TYPE_LATEST)


@router.get("/version")
async def server_version(fleet: ServedFleet) -> dict:
    return {"version": version("fleetctl"), "model": fleet.model_name}


@router.post("/tokenize")
async def tokenize(body: TokenizeBody, fleet: ServedFleet) -> dict:
    if (body.prompt is None) == (body.messages is None):
        raise UserError("give exactly one of prompt or messages")
    text = body.prompt if body.messages is None else fleet.chat_prompt(template_messages(body.messages))
    tokens = await asyncio.to_thread(fleet.encode, text)
    return {"tokens": tokens, "count": len(tokens), "max_model_len": fleet.max_model_len}


@router.post("/detokenize")
async def detokenize(body: DetokenizeBody, fleet: ServedFleet) -> dict:
    vocab = fleet.vocab_size
    if any(not 0 <= t < vocab for t in body.tokens):
        raise UserError(f"token ids must be in [0, {vocab})")
    return {"prompt": fleet.decode(body.tokens)}
