"""The server's way down on SIGTERM or SIGINT, all of it within the grace (ShutdownBudget): the fleet stops
admitting (new requests get 503), the requests in flight finish for the streams' part of the grace and the rest
end with one clear error (Fleet.drain); the workers are asked to exit and killed if they do not in time
(Fleet.stop); then uvicorn stops. A second signal stops at once."""

import asyncio
import logging
import socket
from types import FrameType

import uvicorn

from fleetctl.engine.fleet.facade import FleetFacade
from fleetctl.engine.fleet.shutdown_budget import ShutdownBudget

log = logging.getLogger("fleetctl.server")


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, fleet: FleetFacade, grace_s: float) -> None:
        super().__init__(config)
        self.fleet = fleet
        self.grace_s = grace_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining: asyncio.Task | None = None
        self._signalled = False

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._signalled or not self.started or self._loop is None:
            super().handle_exit(sig, frame)  # a second signal, or one before the fleet serves: stop now
            return
        self._signalled = True
        self._captured_signals.append(sig)  # re-raised once uvicorn is down, as its own handler does
        budget = ShutdownBudget(self.grace_s)  # counted from the signal, not from when the loop gets to it
        self._loop.call_soon_threadsafe(self._begin_drain, budget)

    def _begin_drain(self, budget: ShutdownBudget) -> None:
        assert self._loop is not None
        self._draining = self._loop.create_task(self._drain(budget))

    async def _drain(self, budget: ShutdownBudget) -> None:
        log.warning("shutting down within %g s: %d request(s) in flight get up to %g s to finish (signal again "
                    "to stop now)", budget.grace_s, self.fleet.in_flight, budget.streams_s)
        await self.fleet.drain(budget.streams_s)
        await self.fleet.stop(budget.worker_exit_s())
        self.should_exit = True
