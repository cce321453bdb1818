"""The fleet's HTTP server: one FastAPI app per fleet, the fleet running on the server's event loop.
Routes live by concern in `openai_routes` and `fleet_routes`; this file wires them, the error
handlers, the admin guard, /health and /metrics."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.fleet.errors import FleetError
from fleetctl.engine.server.admission_gate import AdmissionGate
from fleetctl.engine.server.errors import APIError, api_error, invalid_request, too_large
from fleetctl.engine.server.fleet_routes import fleet_router
from fleetctl.engine.server.guard import BodyTooLarge, FleetGuard
from fleetctl.engine.server.openai_routes import openai_router
from fleetctl.engine.server.utility_routes import utility_router


def create_app(fleet: Fleet, admin_token: str | None, bound_host: str = "127.0.0.1",
               api_key: str | None = None) -> FastAPI:
    """admin_token guards /fleet/* (see guard.py); None or "" closes every call that needs it. api_key,
    when set, guards /v1/*."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            await fleet.start()
        except FleetError as exc:  # kept for `serve` to report in one line (uvicorn only logs it)
            app.state.startup_error = str(exc)
            raise
        yield
        await fleet.stop()

    app = FastAPI(title="fleetctl", lifespan=lifespan)
    app.state.startup_error = None
    app.add_exception_handler(APIError, api_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, invalid_request)  # type: ignore[arg-type]
    app.add_exception_handler(BodyTooLarge, too_large)  # type: ignore[arg-type]
    app.add_middleware(AdmissionGate, fleet=fleet)  # inside the guard: only a request let in counts
    app.add_middleware(FleetGuard, bound_host=bound_host, admin_token=admin_token, api_key=api_key)

    app.include_router(openai_router(fleet))
    app.include_router(utility_router(fleet))
    app.include_router(fleet_router(fleet))

    @app.get("/health")
    async def health() -> JSONResponse:
        if fleet.closing:
            return JSONResponse({"status": "shutting down"}, 503)
        ok = fleet.healthy()
        return JSONResponse({"status": "ok" if ok else "degraded"}, 200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        fleet.stats.refresh_gauges(list(fleet.views.values()))
        return PlainTextResponse(generate_latest(fleet.stats.registry), media_type=CONTENT_TYPE_LATEST)

    return app
