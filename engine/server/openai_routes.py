"""The OpenAI-compatible routes: /v1/completions, /v1/chat/completions (SSE streaming, usage) and
/v1/models."""

import asyncio
import json
from collections.abc import AsyncIterator, Callable

from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from fleetctl.engine.core.prompt import PromptError
from fleetctl.engine.core.sequence import SamplingError
from fleetctl.engine.fleet.controller import Fleet, FleetBusy, NoWorkers
from fleetctl.engine.fleet.request import TrackedRequest
from fleetctl.engine.model.tokenizer import TokenizerError
from fleetctl.engine.server import openai_protocol as oai
from fleetctl.engine.server.errors import APIError

ChunkBuilder = Callable[[str, str | None], dict]  # (text delta, finish reason) -> one SSE payload
MAX_CHARS_PER_TOKEN = 32  # no tokenizer needs more: longer prompts cannot fit the context, refuse them untokenized


def openai_router(fleet: Fleet) -> APIRouter:
    router = APIRouter()
    model_name = fleet.model_name

    def check_model(name: str) -> None:
        if name != model_name:
            raise APIError(404, f"The model `{name}` does not exist; this fleet serves `{model_name}`.",
                           "invalid_request_error", "model_not_found")

    def admit(prompt_ids: list[int], body: oai.SamplingFields, requested: int | None, default: int) -> TrackedRequest:
        room = fleet.max_model_len - len(prompt_ids)
        max_tokens = requested or min(default, room)
        if max_tokens > room:
            raise APIError(400, f"max_tokens ({max_tokens}) plus the prompt ({len(prompt_ids)} tokens) exceeds "
                                f"the model's context of {fleet.max_model_len} tokens", "invalid_request_error")
        try:
            return fleet.submit(prompt_ids, body.sampling(max(1, max_tokens)))
        except (PromptError, SamplingError) as exc:
            raise APIError(400, str(exc), "invalid_request_error") from None
        except FleetBusy as exc:
            raise APIError(429, f"the fleet is busy: {exc}", "rate_limit_error", headers={"Retry-After": "1"}) from None
        except NoWorkers as exc:
            raise APIError(503, str(exc), "service_unavailable") from None

    async def tokenize(text: str) -> list[int]:
        """Off the event loop (a long prompt takes a while), and only if it could fit the context at all."""
        if len(text) > fleet.max_model_len * MAX_CHARS_PER_TOKEN:
            raise APIError(400, f"the prompt is {len(text):,} characters; this model's context is "
                                f"{fleet.max_model_len} tokens", "invalid_request_error")
        return await asyncio.to_thread(fleet.tokenizer.encode, text)

    async def collect(req: TrackedRequest) -> str:
        text = ""
        async for event in fleet.stream(req):
            if event.error:
                raise APIError(503, event.error, "service_unavailable")
            text += event.text
        return text

    def sse(req: TrackedRequest, first: list[dict], chunk: ChunkBuilder, kind: str,
            with_usage: bool) -> StreamingResponse:
        async def body() -> AsyncIterator[str]:
            try:
                for payload in first:
                    yield f"data: {json.dumps(payload)}\n\n"
                async for event in fleet.stream(req):
                    if event.error:
                        yield f"data: {json.dumps(oai.error_body(event.error, 'service_unavailable'))}\n\n"
                        break
                    if event.text or event.finish_reason:
                        yield f"data: {json.dumps(chunk(event.text, event.finish_reason))}\n\n"
                if with_usage:
                    use = oai.usage(len(req.prompt_token_ids), len(req.output_token_ids))
                    yield f"data: {json.dumps(oai.usage_chunk(req.request_id, model_name, kind, use))}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                fleet.cancel(req)  # no-op when finished; stops the work when the client went away

        return StreamingResponse(body(), media_type="text/event-stream")

    @router.post("/v1/completions")
    async def completions(body: oai.CompletionRequest) -> object:
        check_model(body.model)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise APIError(400, "only one prompt per request is supported", "invalid_request_error")
            prompt = prompt[0]
        ids = await tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        req = admit(ids, body, body.max_tokens, 16)
        if body.stream:
            return sse(req, [], lambda text, reason: oai.completion_chunk(req.request_id, model_name, text, reason),
                       "text_completion", body.include_usage)
        text = await collect(req)
        use = oai.usage(len(ids), len(req.output_token_ids))
        return oai.completion_body(req.request_id, model_name, text, req.finish_reason or "stop", use)

    @router.post("/v1/chat/completions")
    async def chat(body: oai.ChatRequest) -> object:
        check_model(body.model)
        try:
            prompt = fleet.tokenizer.apply_chat_template(oai.template_messages(body.messages))
        except TokenizerError as exc:
            raise APIError(400, str(exc), "invalid_request_error") from None
        ids = await tokenize(prompt)
        req = admit(ids, body, body.max_completion_tokens or body.max_tokens, fleet.max_model_len)
        if body.stream:
            rid = req.request_id
            first = [oai.chat_chunk(rid, model_name, {"role": "assistant", "content": ""}, None)]
            return sse(req, first,
                       lambda text, reason: oai.chat_chunk(rid, model_name, {"content": text} if text else {}, reason),
                       "chat.completion.chunk", body.include_usage)
        text = await collect(req)
        use = oai.usage(len(ids), len(req.output_token_ids))
        return oai.chat_body(req.request_id, model_name, text, req.finish_reason or "stop", use)

    @router.get("/v1/models")
    async def models() -> dict:
        # max_model_len as vLLM names it: clients size their prompts from it (`fleetctl demo` does)
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "fleetctl",
                                            "max_model_len": fleet.max_model_len}]}

    return router
