"""The fleet's HTTP server: OpenAI-compatible completions and chat (SSE streaming), fleet status,
Prometheus metrics. One server per fleet; the fleet runs on the server's event loop."""

import json
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pydantic import BaseModel, Field

from fleetctl.engine import openai_protocol as oai
from fleetctl.engine.fleet import Fleet, FleetBusy, NoWorkers
from fleetctl.engine.fleet_status import fleet_status, workers_status
from fleetctl.engine.llm_engine import PromptError
from fleetctl.engine.model.tokenizer import TokenizerError
from fleetctl.engine.operations import DEFAULT_HOLD_S, Operation, OperationError
from fleetctl.engine.sequence import SamplingError
from fleetctl.engine.tracked_request import TrackedRequest


class CheckpointBody(BaseModel):
    hold_s: float = Field(default=DEFAULT_HOLD_S, ge=0)


class MigrateBody(BaseModel):
    to: str


class RestoreBody(BaseModel):
    checkpoint: str
    device: str


class APIError(Exception):
    def __init__(self, status: int, message: str, kind: str, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.code, self.headers = status, message, kind, code, headers


def create_app(fleet: Fleet, admin_token: str | None = None) -> FastAPI:
    """admin_token: when set, /fleet/* requires `Authorization: Bearer <token>`."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await fleet.start()
        yield
        await fleet.stop()

    app = FastAPI(title="fleetctl", lifespan=lifespan)
    model_name = fleet.model_name

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(oai.error_body(exc.message, exc.kind, exc.code), exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":
            return JSONResponse(oai.error_body("the request body is not valid JSON", "invalid_request_error"), 400)
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = f"{where}: {first.get('msg', 'invalid request')}" if where else first.get("msg", "invalid request")
        return JSONResponse(oai.error_body(message, "invalid_request_error", param=where or None), 400)

    @app.middleware("http")
    async def admin_guard(request: Request, call_next: Callable) -> object:
        if admin_token and request.url.path.startswith("/fleet/"):
            sent = request.headers.get("authorization", "")
            if not secrets.compare_digest(sent.encode(), f"Bearer {admin_token}".encode()):
                return JSONResponse(oai.error_body("missing or wrong admin token", "authentication_error"), 401)
        return await call_next(request)

    def check_model(name: str) -> None:
        if name != model_name:
            raise APIError(404, f"The model `{name}` does not exist; this fleet serves `{model_name}`.",
                           "invalid_request_error", "model_not_found")

    def admit(prompt_ids: list[int], body: oai._Common, requested: int | None, default: int) -> TrackedRequest:
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

    async def collect(req: TrackedRequest) -> str:
        text = ""
        async for event in fleet.stream(req):
            if event.error:
                raise APIError(503, event.error, "service_unavailable")
            text += event.text
        return text

    def sse(req: TrackedRequest, first: list[dict], chunk: Callable[[str, str | None], dict],
            kind: str, with_usage: bool) -> StreamingResponse:
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

    @app.post("/v1/completions")
    async def completions(body: oai.CompletionRequest, request: Request) -> object:
        check_model(body.model)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise APIError(400, "only one prompt per request is supported", "invalid_request_error")
            prompt = prompt[0]
        ids = fleet.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        req = admit(ids, body, body.max_tokens, 16)
        if body.stream:
            return sse(req, [], lambda text, reason: oai.completion_chunk(req.request_id, model_name,
                                                                                   text, reason),
                       "text_completion", body.include_usage)
        text = await collect(req)
        use = oai.usage(len(ids), len(req.output_token_ids))
        return oai.completion_body(req.request_id, model_name, text, req.finish_reason or "stop", use)

    @app.post("/v1/chat/completions")
    async def chat(body: oai.ChatRequest, request: Request) -> object:
        check_model(body.model)
        try:
            prompt = fleet.tokenizer.apply_chat_template([{"role": m.role, "content": m.text()} for m in body.messages])
        except TokenizerError as exc:
            raise APIError(400, str(exc), "invalid_request_error") from None
        ids = fleet.tokenizer.encode(prompt)
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

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "fleetctl"}]}

    @app.get("/health")
    async def health() -> JSONResponse:
        ok = all(fleet.has_role(role) for role in fleet.needed_roles())
        return JSONResponse({"status": "ok" if ok else "degraded"}, 200 if ok else 503)

    @app.get("/fleet/status")
    async def status() -> dict:
        return fleet_status(fleet, fleet.url)

    @app.get("/fleet/workers")
    async def workers() -> dict:
        return {"workers": workers_status(fleet)}

    def operation(start: Callable[[], Operation]) -> JSONResponse:
        try:
            op = start()
        except OperationError as exc:
            kind = "not_found_error" if exc.status == 404 else "invalid_request_error"
            raise APIError(exc.status, str(exc), kind) from None
        return JSONResponse(op.as_json(), 202, headers={"Location": f"/fleet/operations/{op.id}"})

    @app.post("/fleet/workers/{worker_id}/checkpoint")
    async def checkpoint(worker_id: str, body: CheckpointBody | None = None) -> JSONResponse:
        hold = body.hold_s if body else DEFAULT_HOLD_S
        return operation(lambda: fleet.operations.checkpoint(worker_id, hold))

    @app.post("/fleet/workers/{worker_id}/migrate")
    async def migrate(worker_id: str, body: MigrateBody) -> JSONResponse:
        return operation(lambda: fleet.operations.migrate(worker_id, body.to))

    @app.post("/fleet/restore")
    async def restore(body: RestoreBody) -> JSONResponse:
        return operation(lambda: fleet.operations.restore(body.checkpoint, body.device))

    @app.get("/fleet/checkpoints")
    async def checkpoints() -> dict:
        return {"checkpoints": fleet.operations.list_checkpoints()}

    @app.get("/fleet/operations/{op_id}")
    async def get_operation(op_id: str) -> dict:
        try:
            return fleet.operations.get(op_id).as_json()
        except OperationError as exc:
            raise APIError(exc.status, str(exc), "not_found_error") from None

    @app.get("/fleet/requests")
    async def recent_requests(limit: int = 100) -> dict:
        """Timing breakdowns of the most recently finished requests (newest last)."""
        records = list(fleet.stats.records)
        return {"requests": records[-max(0, limit):] if limit else []}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        fleet.stats.refresh_gauges(list(fleet.views.values()))
        return PlainTextResponse(generate_latest(fleet.stats.registry), media_type=CONTENT_TYPE_LATEST)

    return app
