"""The server's way down on SIGTERM or SIGINT: the fleet stops admitting (new requests get 503), the requests
in flight finish for up to the grace and the rest end with one clear error (Fleet.drain); then uvicorn
stops and, through the app's lifespan, the fleet's workers. A second signal stops at once."""

import asyncio
import logging
import socket
from types import FrameType

import uvicorn

from fleetctl.engine.fleet.controller import Fleet

log = logging.getLogger("fleetctl.server")


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, fleet: Fleet, grace_s: float) -> None:
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
        self._loop.call_soon_threadsafe(self._begin_drain)

    def _begin_drain(self) -> None:
        assert self._loop is not None
        self._draining = self._loop.create_task(self._drain())

    async def _drain(self) -> None:
        in_flight = self.fleet.in_flight
        log.warning("shutting down: %d request(s) in flight get up to %g s to finish (signal again to stop now)",
                    in_flight, self.grace_s)
        await self.fleet.drain(self.grace_s)
        self.should_exit = True
