"""The OpenAI-compatible routes: /v1/completions (one prompt or a list), /v1/chat/completions (both with `n`
samples, logprobs, SSE streaming, usage; completions with `echo`) and /v1/models."""

import asyncio
import contextlib
import json
import re
import uuid
from collections.abc import AsyncIterator, Callable

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from fleetctl.engine.core.prompt import PromptError
from fleetctl.engine.core.sequence import SamplingError
from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.fleet.errors import FleetBusy, NoWorkers, RequestIdInUse
from fleetctl.engine.fleet.request import StreamEvent
from fleetctl.engine.model.tokenizer import TokenizerError
from fleetctl.engine.server import openai_protocol as oai
from fleetctl.engine.server.admission_gate import prepared
from fleetctl.engine.server.choices import Choice, Choices
from fleetctl.engine.server.errors import RETRY_AFTER_S, APIError
from fleetctl.engine.server.openai_logprobs import LogprobsFormat, SampledToken

# (choice, its event, the event's token with logprobs if asked for) -> one SSE payload
ChunkBuilder = Callable[[Choice, StreamEvent, list[SampledToken]], dict]
MAX_CHARS_PER_TOKEN = 32  # no tokenizer needs more: longer prompts cannot fit the context, refuse them untokenized
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")  # a client's X-Request-Id, used as the fleet's request id


def request_id_of(request: Request) -> str:
    """The client's `X-Request-Id` (traced through the fleet, echoed back), or "" for a generated one."""
    given = request.headers.get("x-request-id")
    if given is None:
        return ""
    if not REQUEST_ID.fullmatch(given):
        raise APIError(400, "X-Request-Id must be 1-64 characters of A-Z a-z 0-9 . _ : -", "invalid_request_error")
    return given


def session_of(request: Request, body: oai.SamplingFields) -> str:
    """The agent session a request is a turn of: `X-Session-Id`, else the body's `user` ("" for none). Its KV
    stays in the workers' pools for `--session-ttl` after the turn."""
    given = request.headers.get("x-session-id")
    if given is not None and not REQUEST_ID.fullmatch(given):
        raise APIError(400, "X-Session-Id must be 1-64 characters of A-Z a-z 0-9 . _ : -", "invalid_request_error")
    return given or body.user or ""


def admission_error(exc: Exception) -> APIError:
    if isinstance(exc, FleetBusy):
        return APIError(429, f"the fleet is busy: {exc}", "rate_limit_error",
                        headers={"Retry-After": str(RETRY_AFTER_S)})
    if isinstance(exc, NoWorkers):
        return APIError(503, str(exc), "service_unavailable")
    return APIError(400, str(exc), "invalid_request_error")


def openai_router(fleet: Fleet) -> APIRouter:
    router = APIRouter()
    model_name = fleet.model_name
    logprobs_format = LogprobsFormat(fleet.tokenizer)

    def check_model(name: str) -> None:
        if name != model_name:
            raise APIError(404, f"The model `{name}` does not exist; this fleet serves `{model_name}`.",
                           "invalid_request_error", "model_not_found")

    def max_tokens_for(prompt_ids: list[int], requested: int | None, default: int) -> int:
        room = fleet.max_model_len - len(prompt_ids)
        max_tokens = requested or min(default, room)
        if max_tokens > room:
            raise APIError(400, f"max_tokens ({max_tokens}) plus the prompt ({len(prompt_ids)} tokens) exceeds "
                                f"the model's context of {fleet.max_model_len} tokens", "invalid_request_error")
        return max(1, max_tokens)

    def admit(prompts: list[list[int]], body: oai.SamplingFields, requested: int | None, default: int,
              request_id: str, session: str, echoes: list[str] | None = None) -> Choices:
        """Every prompt's `n` samples, or none of them. Several choices get ids `<id>-<index>`."""
        limits = [max_tokens_for(ids, requested, default) for ids in prompts]
        n = body.n
        many = len(prompts) * n > 1
        base = request_id or (f"req-{uuid.uuid4().hex[:16]}" if many else "")
        choices: list[Choice] = []
        try:
            for p, (ids, limit) in enumerate(zip(prompts, limits, strict=True)):
                request_ids = [f"{base}-{p * n + i}" for i in range(n)] if many else [base]
                reqs = fleet.submit_samples(ids, body.sampling(limit), request_ids, session)
                echo = echoes[p] if echoes else ""
                choices += [Choice(p * n + i, req, echo, text_offset=len(echo)) for i, req in enumerate(reqs)]
        except (PromptError, SamplingError, RequestIdInUse, FleetBusy, NoWorkers) as exc:
            for choice in choices:
                fleet.cancel(choice.req)
            raise admission_error(exc) from None
        finally:
            prepared()
        return Choices(fleet, choices, base if many else choices[0].req.request_id)

    async def tokenize(text: str) -> list[int]:
        """Off the event loop (a long prompt takes a while), and only if it could fit the context at all."""
        if len(text) > fleet.max_model_len * MAX_CHARS_PER_TOKEN:
            raise APIError(400, f"the prompt is {len(text):,} characters; this model's context is "
                                f"{fleet.max_model_len} tokens", "invalid_request_error")
        return await asyncio.to_thread(fleet.tokenizer.encode, text)

    def sse(choices: Choices, first: list[dict], chunk: ChunkBuilder, kind: str, with_usage: bool) -> StreamingResponse:
        async def body() -> AsyncIterator[str]:
            try:
                for payload in first:
                    yield f"data: {json.dumps(payload)}\n\n"
                async with contextlib.aclosing(choices.events()) as events:
                    async for choice, event in events:
                        if event.error:
                            yield f"data: {json.dumps(oai.error_body(event.error, 'service_unavailable'))}\n\n"
                            break
                        tokens = choice.take(event)
                        if event.text or event.finish_reason or tokens:
                            yield f"data: {json.dumps(chunk(choice, event, tokens))}\n\n"
                if with_usage:
                    use = choices.usage()
                    yield f"data: {json.dumps(oai.usage_chunk(choices.response_id, model_name, kind, use))}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                choices.cancel()  # no-op when finished; stops the work when the client went away

        return StreamingResponse(body(), media_type="text/event-stream")

    def completion_logprobs(choice: Choice, tokens: list[SampledToken], wanted: bool) -> dict | None:
        if not wanted:
            return None
        logprobs = logprobs_format.completion(tokens, choice.text_offset)
        choice.text_offset += sum(len(token) for token in logprobs["tokens"])
        return logprobs

    @router.post("/v1/completions")
    async def completions(body: oai.CompletionRequest, request: Request) -> object:
        check_model(body.model)
        request_id, session = request_id_of(request), session_of(request, body)
        prompts = body.prompts()
        ids = [await tokenize(p) if isinstance(p, str) else list(p) for p in prompts]
        echoes = None
        if body.echo:
            echoes = [p if isinstance(p, str) else fleet.tokenizer.decode(p) for p in prompts]
        choices = admit(ids, body, body.max_tokens, 16, request_id, session, echoes)
        rid, wanted = choices.response_id, body.logprobs is not None
        if body.stream:
            first = [oai.completion_chunk(rid, model_name, oai.completion_choice(c.index, c.echo, None))
                     for c in choices.choices if c.echo]

            def chunk(choice: Choice, event: StreamEvent, tokens: list[SampledToken]) -> dict:
                logprobs = completion_logprobs(choice, tokens, wanted)
                return oai.completion_chunk(rid, model_name, oai.completion_choice(
                    choice.index, event.text, event.finish_reason, logprobs))

            return sse(choices, first, chunk, "text_completion", body.include_usage)
        await choices.collect(request)
        return oai.completion_body(rid, model_name, [oai.completion_choice(
            c.index, c.echo + c.text, c.finish_reason, completion_logprobs(c, c.tokens, wanted))
            for c in choices.choices], choices.usage())

    @router.post("/v1/chat/completions")
    async def chat(body: oai.ChatRequest, request: Request) -> object:
        check_model(body.model)
        request_id, session = request_id_of(request), session_of(request, body)
        try:
            prompt = fleet.tokenizer.apply_chat_template(oai.template_messages(body.messages))
        except TokenizerError as exc:
            raise APIError(400, str(exc), "invalid_request_error") from None
        ids = await tokenize(prompt)
        choices = admit([ids], body, body.max_completion_tokens or body.max_tokens, fleet.max_model_len, request_id,
                        session)
        rid = choices.response_id

        def chat_logprobs(tokens: list[SampledToken]) -> dict | None:
            return logprobs_format.chat(tokens) if body.logprobs else None

        if body.stream:
            first = [oai.chat_chunk(rid, model_name, c.index, {"role": "assistant", "content": ""}, None)
                     for c in choices.choices]
            return sse(choices, first, lambda choice, event, tokens: oai.chat_chunk(
                rid, model_name, choice.index, {"content": event.text} if event.text else {}, event.finish_reason,
                chat_logprobs(tokens)), "chat.completion.chunk", body.include_usage)
        await choices.collect(request)
        return oai.chat_body(rid, model_name, [oai.chat_choice(
            c.index, c.text, c.finish_reason, chat_logprobs(c.tokens)) for c in choices.choices], choices.usage())

    @router.get("/v1/models")
    async def models() -> dict:
        # max_model_len as vLLM names it: clients size their prompts from it (`fleetctl demo` does)
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "fleetctl",
                                            "max_model_len": fleet.max_model_len}]}

    return router
