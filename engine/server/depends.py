"""What the routes depend on (FastAPI's `Depends`): the fleet the app serves, seen only through its façade, and
the formatter of its tokens' logprobs — both set on `app.state` by `create_app`. Coroutines, so FastAPI calls
them on the event loop rather than in its thread pool."""

from typing import Annotated

from fastapi import Depends, Request

from fleetctl.engine.fleet.facade import FleetFacade
from fleetctl.engine.server.openai_logprobs import LogprobsFormat


async def fleet_of(request: Request) -> FleetFacade:
    return request.app.state.fleet


async def logprobs_of(request: Request) -> LogprobsFormat:
    return request.app.state.logprobs


ServedFleet = Annotated[FleetFacade, Depends(fleet_of)]
Logprobs = Annotated[LogprobsFormat, Depends(logprobs_of)]
