"""The fleet's HTTP server: one FastAPI app per fleet, the fleet running on the server's event loop. Routes
live by concern in `openai_routes`, `responses_routes`, `fleet_routes` and `utility_routes`, each reaching the
fleet through its façade (`depends.ServedFleet`); this file wires them, the error handlers (`errors`), the admin
guard and the admission gate."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError

from fleetctl.engine.fleet.errors import FleetError
from fleetctl.engine.fleet.facade import FleetFacade
from fleetctl.engine.server import fleet_routes, openai_routes, responses_routes, utility_routes
from fleetctl.engine.server.admission_gate import AdmissionGate
from fleetctl.engine.server.conversations import Conversations
from fleetctl.engine.server.errors import fleetctl_error, invalid_request
from fleetctl.engine.server.guard import FleetGuard
from fleetctl.engine.server.openai_logprobs import LogprobsFormat
from fleetctl.engine.server.server_settings import ServerSettings
from fleetctl.errors import FleetctlError


def create_app(fleet: FleetFacade, admin_token: str | None, bound_host: str = "127.0.0.1",
               api_key: str | None = None, response_ttl_s: float = ServerSettings.response_ttl_s) -> FastAPI:
    """admin_token guards /fleet/* (see guard.py); None or "" closes every call that needs it. api_key,
    when set, guards /v1/*. /v1/responses keeps conversations `response_ttl_s`."""

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
    app.state.fleet = fleet
    app.state.logprobs = LogprobsFormat(fleet.token_bytes)
    app.state.conversations = Conversations(response_ttl_s)
    app.add_exception_handler(FleetctlError, fleetctl_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, invalid_request)  # type: ignore[arg-type]
    app.add_middleware(AdmissionGate, fleet=fleet)  # inside the guard: only a request let in counts
    app.add_middleware(FleetGuard, bound_host=bound_host, admin_token=admin_token, api_key=api_key)
    for routes in (openai_routes, responses_routes, utility_routes, fleet_routes):
        app.include_router(routes.router)
    return app
