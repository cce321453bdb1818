"""How the server answers what goes wrong, always with OpenAI's error body: an expected failure by its family
(`fleetctl.errors`: its `http_status` and `error_type`, and a 429 with Retry-After), a body or parameter that
fails validation with a 400 naming the field. No route catches errors to answer them; anything else that
escapes is a bug, and FastAPI answers it with a 500."""

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from fleetctl.engine.server.openai_protocol import error_body
from fleetctl.errors import FleetctlError, NotFound

RETRY_AFTER_S = 1  # what a refusal for load (429 past max_queue, 503 past --limit-concurrency) asks clients to wait


class UnknownModel(NotFound):
    """A request for a model this fleet does not serve: typed and coded as OpenAI answers it."""

    error_type = "invalid_request_error"
    code = "model_not_found"


class GenerationFailed(FleetctlError):
    """A request the fleet admitted ended with an error before its answer was whole (its workers failed it, or
    the fleet shut down first)."""

    http_status = 503
    error_type = "service_unavailable"


async def fleetctl_error(_: Request, exc: FleetctlError) -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if exc.http_status == 429 else None
    code = getattr(exc, "code", None)  # OpenAI's `code`, which few errors have
    return JSONResponse(error_body(str(exc), exc.error_type, code), exc.http_status, headers=headers)


async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
    """A body or parameter that fails validation: 400 naming the bad field. Of a union's failed branches, the one
    that got deepest into the value says what is wrong (a list item's unknown `type` rather than "not a string");
    pydantic's names for the branches themselves are left out of the field's path."""
    errors = exc.errors()
    first = max(errors, key=lambda error: len(error.get("loc", ()))) if errors else {}
    if first.get("type") == "json_invalid":
        return JSONResponse(error_body("the request body is not valid JSON", "invalid_request_error"), 400)
    where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path") and not (
        isinstance(p, str) and "[" in p))
    message = f"{where}: {first.get('msg', 'invalid request')}" if where else first.get("msg", "invalid request")
    return JSONResponse(error_body(message, "invalid_request_error", param=where or None), 400)
