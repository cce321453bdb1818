"""`serve --limit-concurrency N` (a pure ASGI middleware): beyond N open connections, or N requests in progress, a
request gets 503 with Retry-After, OpenAI's error body and `Connection: close`, before any work is spent on it.
It counts what uvicorn's own `limit_concurrency` counts (the server's connections and request tasks), but
uvicorn's answers a bare "Service Unavailable" text without Retry-After, serves one connection fewer than N and
refuses /health too. /health is always let through here: a server at its connection limit is busy, not dead,
and a probe must not restart it.
"""

from uvicorn.server import ServerState

from fleetctl.engine.server.errors import RETRY_AFTER_S
from fleetctl.engine.server.guard import ASGIApp, Receive, Scope, Send, send_error

ALWAYS_ANSWERED = "/health"


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
