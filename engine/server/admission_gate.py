"""The admission gate (a pure ASGI middleware in front of the generation routes): a request is admitted only
after its body is read, validated and tokenized, and until then the fleet's queue does not count it. In a burst
of hundreds that preparation alone, done for requests that will be refused anyway, delays the admitted ones.
The gate counts the requests being prepared and refuses one before its body is read (429, Retry-After, the same
error body as the fleet's own refusal) once the queue and they together would pass `--max-queue`."""

from contextvars import ContextVar

from fleetctl.engine.fleet.facade import FleetFacade
from fleetctl.engine.server.errors import RETRY_AFTER_S
from fleetctl.engine.server.guard import ASGIApp, Receive, Scope, Send, send_error

GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")


class _Preparing:
    """One request's place among those being prepared, given back once (when admitted or refused, or at its end)."""

    def __init__(self, gate: "AdmissionGate") -> None:
        self.gate, self.held = gate, True

    def give_back(self) -> None:
        if self.held:
            self.held = False
            self.gate.preparing -= 1


_current: ContextVar[_Preparing | None] = ContextVar("preparing", default=None)


def prepared() -> None:
    """The route's request was admitted or refused: it no longer counts as being prepared."""
    place = _current.get()
    if place is not None:
        place.give_back()


class AdmissionGate:
    def __init__(self, app: ASGIApp, fleet: FleetFacade) -> None:
        self.app = app
        self.fleet = fleet
        self.preparing = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in GENERATION_PATHS:
            await self.app(scope, receive, send)
            return
        waiting = self.fleet.queue_full(self.preparing + 1)
        if waiting is not None:
            await send_error(send, 429, f"the fleet is busy: {waiting} requests are already waiting and "
                                        f"{self.preparing} more are being read", "rate_limit_error",
                             {"Retry-After": str(RETRY_AFTER_S)})
            return
        self.preparing += 1
        place = _Preparing(self)
        token = _current.set(place)
        try:
            await self.app(scope, receive, send)
        finally:
            place.give_back()
            _current.reset(token)
