"""The OpenAI-compatible routes: /v1/completions, /v1/chat/completions (SSE streaming, usage) and
/v1/models."""

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from fleetctl.engine.core.prompt import PromptError
from fleetctl.engine.core.sequence import SamplingError
from fleetctl.engine.fleet.admission import FleetBusy, NoWorkers, RequestIdInUse
from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.fleet.request import TrackedRequest
from fleetctl.engine.model.tokenizer import TokenizerError
from fleetctl.engine.server import openai_protocol as oai
from fleetctl.engine.server.errors import APIError

ChunkBuilder = Callable[[str, str | None], dict]  # (text delta, finish reason) -> one SSE payload
MAX_CHARS_PER_TOKEN = 32  # no tokenizer needs more: longer prompts cannot fit the context, refuse them untokenized
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")  # a client's X-Request-Id, used as the fleet's request id
DISCONNECT_POLL_S = 0.25  # how often a non-streaming request checks that its client is still there


def request_id_of(request: Request) -> str:
    """The client's `X-Request-Id` (traced through the fleet, echoed back), or "" for a generated one."""
    given = request.headers.get("x-request-id")
    if given is None:
        return ""
    if not REQUEST_ID.fullmatch(given):
        raise APIError(400, "X-Request-Id must be 1-64 characters of A-Z a-z 0-9 . _ : -", "invalid_request_error")
    return given


def openai_router(fleet: Fleet) -> APIRouter:
    router = APIRouter()
    model_name = fleet.model_name

    def check_model(name: str) -> None:
        if name != model_name:
            raise APIError(404, f"The model `{name}` does not exist; this fleet serves `{model_name}`.",
                           "invalid_request_error", "model_not_found")

    def admit(prompt_ids: list[int], body: oai.SamplingFields, requested: int | None, default: int,
              request_id: str) -> TrackedRequest:
        room = fleet.max_model_len - len(prompt_ids)
        max_tokens = requested or min(default, room)
        if max_tokens > room:
            raise APIError(400, f"max_tokens ({max_tokens}) plus the prompt ({len(prompt_ids)} tokens) exceeds "
                                f"the model's context of {fleet.max_model_len} tokens", "invalid_request_error")
        try:
            return fleet.submit(prompt_ids, body.sampling(max(1, max_tokens)), request_id)
        except (PromptError, SamplingError, RequestIdInUse) as exc:
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

    async def collect(req: TrackedRequest, request: Request) -> str:
        """The whole answer; the work stops (queued, held or running) when the client goes away first."""
        watcher = asyncio.create_task(cancel_when_gone(req, request))
        text = ""
        try:
            async for event in fleet.stream(req):
                if event.error:
                    raise APIError(503, event.error, "service_unavailable")
                text += event.text
        finally:
            watcher.cancel()
            fleet.cancel(req)  # no-op when finished
        return text

    async def cancel_when_gone(req: TrackedRequest, request: Request) -> None:
        while not req.done:
            if await request.is_disconnected():
                fleet.cancel(req)
                return
            await asyncio.sleep(DISCONNECT_POLL_S)

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
    async def completions(body: oai.CompletionRequest, request: Request) -> object:
        check_model(body.model)
        request_id = request_id_of(request)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise APIError(400, "only one prompt per request is supported", "invalid_request_error")
            prompt = prompt[0]
        ids = await tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        req = admit(ids, body, body.max_tokens, 16, request_id)
        if body.stream:
            return sse(req, [], lambda text, reason: oai.completion_chunk(req.request_id, model_name, text, reason),
                       "text_completion", body.include_usage)
        text = await collect(req, request)
        use = oai.usage(len(ids), len(req.output_token_ids))
        return oai.completion_body(req.request_id, model_name, text, req.finish_reason or "stop", use)

    @router.post("/v1/chat/completions")
    async def chat(body: oai.ChatRequest, request: Request) -> object:
        check_model(body.model)
        request_id = request_id_of(request)
        try:
            prompt = fleet.tokenizer.apply_chat_template(oai.template_messages(body.messages))
        except TokenizerError as exc:
            raise APIError(400, str(exc), "invalid_request_error") from None
        ids = await tokenize(prompt)
        req = admit(ids, body, body.max_completion_tokens or body.max_tokens, fleet.max_model_len, request_id)
        if body.stream:
            rid = req.request_id
            first = [oai.chat_chunk(rid, model_name, {"role": "assistant", "content": ""}, None)]
            return sse(req, first,
                       lambda text, reason: oai.chat_chunk(rid, model_name, {"content": text} if text else {}, reason),
                       "chat.completion.chunk", body.include_usage)
        text = await collect(req, request)
        use = oai.usage(len(ids), len(req.output_token_ids))
        return oai.chat_body(req.request_id, model_name, text, req.finish_reason or "stop", use)

    @router.get("/v1/models")
    async def models() -> dict:
        # max_model_len as vLLM names it: clients size their prompts from it (`fleetctl demo` does)
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "fleetctl",
                                            "max_model_len": fleet.max_model_len}]}

    return router
