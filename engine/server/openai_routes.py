"""The OpenAI-compatible routes: /v1/completions (one prompt or a list), /v1/chat/completions (both with `n`
samples, logprobs, SSE streaming, usage; completions with `echo`, chat with tools: tool_calls.py) and
/v1/models."""

import asyncio
import contextlib
import json
import re
import uuid
from collections.abc import AsyncIterator, Callable

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from fleetctl.engine.core.grammar import COMPILE_WAIT_S, GrammarError
from fleetctl.engine.fleet.facade import FleetFacade
from fleetctl.engine.fleet.request import StreamEvent
from fleetctl.engine.server import openai_protocol as oai
from fleetctl.engine.server.admission_gate import prepared
from fleetctl.engine.server.choices import Choice, Choices
from fleetctl.engine.server.depends import Logprobs, ServedFleet
from fleetctl.engine.server.errors import GenerationFailed, UnknownModel
from fleetctl.engine.server.openai_logprobs import LogprobsFormat, SampledToken
from fleetctl.engine.server.response_format import Constraint
from fleetctl.engine.server.tool_calls import ToolCalling
from fleetctl.errors import UserError

# (choice, its event, the event's token with logprobs if asked for) -> one SSE payload
ChunkBuilder = Callable[[Choice, StreamEvent, list[SampledToken]], dict]
MAX_CHARS_PER_TOKEN = 32  # no tokenizer needs more: longer prompts cannot fit the context, refuse them untokenized
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")  # a client's X-Request-Id, used as the fleet's request id
COMPLETION_MAX_TOKENS = 16  # /v1/completions' default max_tokens, as OpenAI's (chat's: the rest of the context)

router = APIRouter()


def request_id_of(request: Request) -> str:
    """The client's `X-Request-Id` (traced through the fleet, echoed back), or "" for a generated one."""
    given = request.headers.get("x-request-id")
    if given is None:
        return ""
    if not REQUEST_ID.fullmatch(given):
        raise UserError("X-Request-Id must be 1-64 characters of A-Z a-z 0-9 . _ : -")
    return given


def session_of(request: Request, body: oai.SamplingFields) -> str:
    """The agent session a request is a turn of: `X-Session-Id`, else the body's `user` ("" for none). Its KV
    stays in the workers' pools for `--session-ttl` after the turn."""
    given = request.headers.get("x-session-id")
    if given is not None and not REQUEST_ID.fullmatch(given):
        raise UserError("X-Session-Id must be 1-64 characters of A-Z a-z 0-9 . _ : -")
    return given or body.user or ""


def check_model(fleet: FleetFacade, name: str) -> None:
    if name != fleet.model_name:
        raise UnknownModel(f"The model `{name}` does not exist; this fleet serves `{fleet.model_name}`.")


def max_tokens_for(fleet: FleetFacade, prompt_ids: list[int], requested: int | None, default: int) -> int:
    room = fleet.max_model_len - len(prompt_ids)
    max_tokens = requested or min(default, room)
    if max_tokens > room:
        raise UserError(f"max_tokens ({max_tokens}) plus the prompt ({len(prompt_ids)} tokens) exceeds the model's "
                        f"context of {fleet.max_model_len} tokens")
    return max(1, max_tokens)


async def tokenize(fleet: FleetFacade, text: str) -> list[int]:
    """Off the event loop (a long prompt takes a while), and only if it could fit the context at all."""
    if len(text) > fleet.max_model_len * MAX_CHARS_PER_TOKEN:
        raise UserError(f"the prompt is {len(text):,} characters; this model's context is {fleet.max_model_len} "
                        f"tokens")
    return await asyncio.to_thread(fleet.encode, text)


async def compiled(fleet: FleetFacade, constraint: Constraint | None) -> Constraint | None:
    """The request's constraint once the fleet compiled its grammar (off the event loop, cached by its hash), so
    a grammar no worker could use is a 400 before anything is admitted."""
    if constraint is not None:
        try:
            await asyncio.wait_for(asyncio.to_thread(fleet.compile_grammar, constraint.grammar), COMPILE_WAIT_S)
        except TimeoutError:
            raise GrammarError(f"the grammar did not compile within {COMPILE_WAIT_S:g} s") from None
    return constraint


def admit(fleet: FleetFacade, prompts: list[list[int]], body: oai.SamplingFields, requested: int | None,
          default: int, request_id: str, session: str, echoes: list[str] | None = None,
          constraint: Constraint | None = None) -> Choices:
    """Every prompt's `n` samples, or none of them. Several choices get ids `<id>-<index>`."""
    limits = [max_tokens_for(fleet, ids, requested, default) for ids in prompts]
    n = body.n
    many = len(prompts) * n > 1
    base = request_id or (f"req-{uuid.uuid4().hex[:16]}" if many else "")
    choices: list[Choice] = []
    try:
        for p, (ids, limit) in enumerate(zip(prompts, limits, strict=True)):
            request_ids = [f"{base}-{p * n + i}" for i in range(n)] if many else [base]
            generations = fleet.generate(ids, body.sampling(limit, constraint), request_ids, session)
            echo = echoes[p] if echoes else ""
            choices += [Choice(p * n + i, p, g, echo, text_offset=len(echo)) for i, g in enumerate(generations)]
    except BaseException:  # a prompt refused refuses the call: the samples admitted before it stop
        for choice in choices:
            choice.generation.cancel()
        raise
    finally:
        prepared()
    return Choices(choices, base if many else choices[0].generation.id)


def sse(choices: Choices, first: list[dict], chunk: ChunkBuilder, kind: str, model: str,
        with_usage: bool) -> StreamingResponse:
    """The choices' events as server-sent events: `first`, a chunk per event, the usage chunk if asked for."""

    async def body() -> AsyncIterator[str]:
        try:
            for payload in first:
                yield f"data: {json.dumps(payload)}\n\n"
            async with contextlib.aclosing(choices.events()) as events:
                async for choice, event in events:
                    if event.error:
                        yield f"data: {json.dumps(oai.error_body(event.error, GenerationFailed.error_type))}\n\n"
                        break
                    tokens = choice.take(event)
                    if event.text or event.finish_reason or tokens:
                        yield f"data: {json.dumps(chunk(choice, event, tokens))}\n\n"
            if with_usage:
                usage = choices.usage()
                yield f"data: {json.dumps(oai.usage_chunk(choices.response_id, model, kind, usage))}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            choices.cancel()  # no-op when finished; stops the work when the client went away

    return StreamingResponse(body(), media_type="text/event-stream")


def completion_logprobs(logprobs_format: LogprobsFormat, choice: Choice, tokens: list[SampledToken],
                        wanted: bool) -> dict | None:
    if not wanted:
        return None
    logprobs = logprobs_format.completion(tokens, choice.text_offset)
    choice.text_offset += sum(len(token) for token in logprobs["tokens"])
    return logprobs


@router.post("/v1/completions")
async def completions(body: oai.CompletionRequest, request: Request, fleet: ServedFleet,
                      logprobs_format: Logprobs) -> object:
    check_model(fleet, body.model)
    request_id, session = request_id_of(request), session_of(request, body)
    prompts = body.prompts()
    ids = [await tokenize(fleet, p) if isinstance(p, str) else list(p) for p in prompts]
    echoes = [p if isinstance(p, str) else fleet.decode(p) for p in prompts] if body.echo else None
    constraint = await compiled(fleet, body.constraint())
    choices = admit(fleet, ids, body, body.max_tokens, COMPLETION_MAX_TOKENS, request_id, session, echoes,
                    constraint)
    rid, model, wanted = choices.response_id, fleet.model_name, body.logprobs is not None
    if body.stream:
        first = [oai.completion_chunk(rid, model, oai.completion_choice(c.index, c.echo, None))
                 for c in choices.choices if c.echo]

        def chunk(choice: Choice, event: StreamEvent, tokens: list[SampledToken]) -> dict:
            logprobs = completion_logprobs(logprobs_format, choice, tokens, wanted)
            return oai.completion_chunk(rid, model, oai.completion_choice(
                choice.index, event.text, event.finish_reason, logprobs))

        return sse(choices, first, chunk, "text_completion", model, body.include_usage)
    await choices.collect(request)
    return oai.completion_body(rid, model, [oai.completion_choice(
        c.index, c.echo + c.text, c.finish_reason, completion_logprobs(logprobs_format, c, c.tokens, wanted))
        for c in choices.choices], choices.usage())


@router.post("/v1/chat/completions")
async def chat(body: oai.ChatRequest, request: Request, fleet: ServedFleet, logprobs_format: Logprobs) -> object:
    check_model(fleet, body.model)
    request_id, session = request_id_of(request), session_of(request, body)
    tools = ToolCalling.of(body, fleet)
    ids = await tokenize(fleet, tools.prompt(fleet))
    constraint = await compiled(fleet, tools.constraint or body.constraint())
    choices = admit(fleet, [ids], body, body.max_completion_tokens or body.max_tokens, fleet.max_model_len,
                    request_id, session, constraint=constraint)
    rid, model = choices.response_id, fleet.model_name

    def chat_logprobs(tokens: list[SampledToken]) -> dict | None:
        return logprobs_format.chat(tokens) if body.logprobs else None

    if body.stream:
        first = [oai.chat_chunk(rid, model, c.index, {"role": "assistant", "content": ""}, None)
                 for c in choices.choices]

        def chunk(choice: Choice, event: StreamEvent, tokens: list[SampledToken]) -> dict:
            delta, reason = tools.delta(choice.index, event.text, event.finish_reason)
            return oai.chat_chunk(rid, model, choice.index, delta, reason, chat_logprobs(tokens))

        return sse(choices, first, chunk, "chat.completion.chunk", model, body.include_usage)
    await choices.collect(request)
    answers = [(c, *tools.message(c.text, c.finish_reason)) for c in choices.choices]
    return oai.chat_body(rid, model, [oai.chat_choice(c.index, message, reason, chat_logprobs(c.tokens))
                                      for c, message, reason in answers], choices.usage())


@router.get("/v1/models")
async def models(fleet: ServedFleet) -> dict:
    # max_model_len as vLLM names it: clients size their prompts from it (`fleetctl demo` does)
    return {"object": "list", "data": [{"id": fleet.model_name, "object": "model", "created": 0,
                                        "owned_by": "fleetctl", "max_model_len": fleet.max_model_len}]}
