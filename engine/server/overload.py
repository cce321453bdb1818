"""Overload answered before any work is spent on it (pure ASGI middlewares):

- `RefuseWhenBusy`: a completion arriving while the fleet already has `max_queue` requests waiting gets its 429
  (Retry-After, OpenAI's error body) before its body is read, validated or tokenized, so a burst far past the
  queue costs the event loop little and the requests admitted keep their TTFT. The routes' own admission check
  stays the one that decides (a request can pass here and be refused there, never the other way).
- `ConnectionLimit` (`serve --limit-concurrency N`): beyond N open connections, or N requests in progress, a
  request gets 503 with Retry-After, OpenAI's error body and `Connection: close`. It counts what uvicorn's own
  `limit_concurrency` counts (the server's connections and request tasks), but uvicorn's answers a bare
  "Service Unavailable" text, serves one connection fewer than N and refuses /health too. /health is always let
  through here: a server at its connection limit is busy, not dead, and a probe must not restart it.
"""

from uvicorn.server import ServerState

from fleetctl.engine.fleet.admission import Admission
from fleetctl.engine.fleet.errors import FleetBusy
from fleetctl.engine.server.errors import RETRY_AFTER_S
from fleetctl.engine.server.guard import ASGIApp, Receive, Scope, Send, send_error
from fleetctl.engine.server.openai_routes import admission_error

GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
ALWAYS_ANSWERED = "/health"


class RefuseWhenBusy:
    def __init__(self, app: ASGIApp, *, admission: Admission) -> None:
        self.app = app
        self.admission = admission

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in GENERATION_PATHS:
            try:
                self.admission.check_capacity()
            except FleetBusy as exc:
                refusal = admission_error(exc)
                await send_error(send, refusal.status, refusal.message, refusal.kind, refusal.headers)
                return
        await self.app(scope, receive, send)


class ConnectionLimit:
    def __init__(self, app: ASGIApp, limit: int, server: ServerState) -> None:
        self.app = app
        self.limit = limit
        self.server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # this request's own connection and task are among those counted: more than `limit` is past it
        over = len(self.server.connections) > self.limit or len(self.server.tasks) > self.limit
        if over and scope["type"] == "http" and scope["path"] != ALWAYS_ANSWERED:
            await send_error(send, 503, f"the server has its limit of {self.limit} connections open "
                                        f"(serve --limit-concurrency); retry in {RETRY_AFTER_S} s",
                             "service_unavailable", {"Retry-After": str(RETRY_AFTER_S), "Connection": "close"})
            return
        await self.app(scope, receive, send)
