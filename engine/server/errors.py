"""Errors the HTTP routes raise, answered with OpenAI's error body."""

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from fleetctl.engine.server.guard import TOO_LARGE
from fleetctl.engine.server.openai_protocol import error_body

RETRY_AFTER_S = 1  # what a refusal for load (429 past max_queue, 503 past --limit-concurrency) asks clients to wait


class APIError(Exception):
    def __init__(self, status: int, message: str, kind: str, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.code, self.headers = status, message, kind, code, headers


async def api_error(_: Request, exc: APIError) -> JSONResponse:
    return JSONResponse(error_body(exc.message, exc.kind, exc.code), exc.status, headers=exc.headers)


async def too_large(_: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(error_body(TOO_LARGE, "invalid_request_error"), 413)


async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
    """A body or parameter that fails validation: 400 naming the first bad field."""
    first = exc.errors()[0] if exc.errors() else {}
    if first.get("type") == "json_invalid":
        return JSONResponse(error_body("the request body is not valid JSON", "invalid_request_error"), 400)
    where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path"))
    message = f"{where}: {first.get('msg', 'invalid request')}" if where else first.get("msg", "invalid request")
    return JSONResponse(error_body(message, "invalid_request_error", param=where or None), 400)
